"""Generate with the embedded default model: a batch, a chat prompt, and streaming.

    python examples/quickstart.py
"""

import leapgen

llm = leapgen.LLM()                      # SmolLM2-135M-Instruct, put in ~/.cache/leapgen by scripts/setup.sh
params = leapgen.SamplingParams(max_tokens=24)

# A batch of prompts of different lengths runs together (continuous batching, paged KV cache).
for out in llm.generate(["The three primary colours are", "def add(a, b):\n    "], params):
    print(repr(out.text), out.finish_reason, len(out.token_ids), "tokens")

# The model's chat template, and text streamed as it is produced.
for piece in llm.stream(llm.chat_prompt("Name one planet of the solar system."), params):
    print(piece, end="", flush=True)
print()

# One call, no LLM object kept: keyword arguments are SamplingParams fields.
print(leapgen.generate(llm, "Water boils at", max_tokens=8).text)
