"""Beam search (beams share the prompt's KV blocks) and n samples per prompt.

    python examples/beam_search.py
"""

import leapgen

llm = leapgen.LLM()
prompt = llm.chat_prompt("Complete the proverb: An apple a day")

beams = llm.generate(prompt, leapgen.SamplingParams(max_tokens=16, num_beams=4, n=2, length_penalty=1.0))[0]
for completion in beams.outputs:
    print(f"beam  score={completion.score:.3f}  {completion.text!r}")

samples = llm.generate(prompt, leapgen.SamplingParams(max_tokens=16, n=3, temperature=0.9, top_p=0.95, seed=1))[0]
for completion in samples.outputs:
    print(f"sample  {completion.text!r}")
