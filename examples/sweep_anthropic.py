"""The plain Anthropic streaming loop, as most apps write it: run under `streamtap sweep`.

    streamtap sweep recordings/anthropic.jsonl -- python examples/sweep_anthropic.py

The SDK reads ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY, which the sweep sets to its replay
server. `get_final_message()` returns whatever had accumulated when the body ended; it does
not check that message_stop arrived, so a clean cut passes as a shorter answer.
"""

import anthropic

client = anthropic.Anthropic()
with client.messages.stream(
    model="claude-sonnet-4-6",
    max_tokens=1024,
    messages=[{"role": "user", "content": "Weather in Paris?"}],
) as stream:
    for text in stream.text_stream:
        print(text, end="", flush=True)
    message = stream.get_final_message()
print()
print(f"[stop_reason={message.stop_reason}, {len(message.content)} blocks]")
