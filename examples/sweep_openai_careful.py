"""The same OpenAI loop, careful: it checks that the answer really finished.

    streamtap sweep recordings/openai-chat.jsonl -- python examples/sweep_openai_careful.py

The answer must end with a finish_reason; a stream that ends before one exits 1.
(The SDK hides the [DONE] sentinel, so finish_reason is what a client can check.)
"""

import sys

import openai

client = openai.OpenAI()
finished = {}
text = []
stream = client.chat.completions.create(
    model="gpt-4.1-nano",
    messages=[{"role": "user", "content": "Weather in Paris?"}],
    stream=True,
)
for chunk in stream:
    for choice in chunk.choices:
        text.append(choice.delta.content or "")
        if choice.finish_reason:
            finished[choice.index] = choice.finish_reason
print("".join(text))
if not finished:
    sys.exit("incomplete answer: the stream ended without a finish_reason")
