"""The plain OpenAI streaming loop, as most apps write it: run under `streamtap sweep`.

    streamtap sweep recordings/openai-chat.jsonl -- python examples/sweep_openai.py

The SDK reads OPENAI_BASE_URL and OPENAI_API_KEY, which the sweep sets to its replay
server. The loop prints the text and exits 0, whatever happened to the stream: the SDK
stops iterating when the body ends, [DONE] or not, so every clean cut is accepted
silently (an abort raises httpx.RemoteProtocolError out of the loop: noticed).
"""

import openai

client = openai.OpenAI()
stream = client.chat.completions.create(
    model="gpt-4.1-nano",
    messages=[{"role": "user", "content": "Weather in Paris?"}],
    stream=True,
)
for chunk in stream:
    for choice in chunk.choices:
        print(choice.delta.content or "", end="", flush=True)
print()
