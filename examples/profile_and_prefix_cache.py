"""Where a step's time goes, and what the prefix cache saves on prompts that share their beginning.

Prompts built from one instruction (an extraction template, a system prompt) share their first blocks: the
engine keeps those blocks' KV after a request ends and the next prompt starts from them.
`LLM.reset_prefix_cache()` forgets them (to time a cold prefill, or when the shared text changes).
Run: python examples/profile_and_prefix_cache.py
"""

import time

import leapgen

llm = leapgen.LLM()                      # the embedded SmolLM2-135M-Instruct
instruction = ("You are a careful assistant. Read the note below and answer with one short sentence that "
               "names the person, the place and the date it mentions. ") * 4
notes = ["Maria met Tom in Lisbon on 3 May.", "Ana flew to Oslo on 12 June.", "Ben stayed in Rome in July."]
params = leapgen.SamplingParams(max_tokens=24)


def run(label: str) -> None:
    start = time.perf_counter()
    outs = [llm.generate([llm.chat_prompt(instruction + note)], params)[0] for note in notes]
    print(f"{label}: {time.perf_counter() - start:.2f}s for {len(outs)} prompts, one at a time")


llm.reset_prefix_cache()
run("cold cache, the instruction shared from the second prompt on")
run("every prompt seen before")
print(f"forgot {llm.reset_prefix_cache()} cached blocks")

profile = leapgen.StepProfile()
with profile.active():
    llm.generate([llm.chat_prompt(note) for note in notes], leapgen.SamplingParams(max_tokens=32))
print(profile.table())
