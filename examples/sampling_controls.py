"""Sampling controls on the embedded default model: greedy vs temperature / top-p with seeds,
repetition penalty, stop strings and logprobs.

    python examples/sampling_controls.py
"""

import leapgen

llm = leapgen.LLM()                      # SmolLM2-135M-Instruct, put in ~/.cache/leapgen by scripts/setup.sh
prompt = llm.chat_prompt("Describe the sea in one sentence.")

# Greedy (temperature 0, the default) always gives the same text.  Sampling with temperature 0.8 and
# top_p 0.9 (the smallest set of tokens holding 90% of the probability): a seed makes a sample
# reproducible whatever shares its batch, so seed 1 below gives the same text twice.
# One generate call runs all four, each prompt with its own SamplingParams.
greedy = leapgen.SamplingParams(max_tokens=24)
sampled = [leapgen.SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=seed) for seed in (1, 2, 1)]
for name, out in zip(["greedy", "seed 1", "seed 2", "seed 1"], llm.generate([prompt] * 4, [greedy, *sampled])):
    print(f"{name:>8}: {out.text!r}")

# Repetition penalty (> 1) makes tokens already in the prompt or output less likely; this prompt
# invites a loop, shown greedy without and with it.
loop = "one two three one two three one two three"
penalties = [leapgen.SamplingParams(max_tokens=24, repetition_penalty=p) for p in (1.0, 1.5)]
for params, out in zip(penalties, llm.generate([loop, loop], penalties)):
    print(f"repetition_penalty={params.repetition_penalty}: {out.text!r}")

# A stop string ends the output where it first appears (left out of the text unless
# include_stop_str_in_output=True); finish_reason says why generation ended.
out = llm.generate(prompt, leapgen.SamplingParams(max_tokens=24, stop=[","]))[0]
print(f"stop=',': {out.text!r}  finish_reason={out.finish_reason} stop_reason={out.outputs[0].stop_reason!r}")

# Logprobs: each generated token's log-probability under the model, and its 3 best alternatives.
out = llm.generate("The capital of France is", leapgen.SamplingParams(max_tokens=6, logprobs=3))[0]
print(f"logprobs of {out.text!r} (ids {out.token_ids}):")
decode = llm.tokenizer.decode
for entry in out.outputs[0].logprobs:
    alternatives = ", ".join(f"{decode([t])!r} {logprob:.2f}" for t, logprob in entry.top.items())
    print(f"  {decode([entry.token_id])!r:>10} {entry.logprob:6.2f}   top 3: {alternatives}")
