"""Speculative decoding by prompt lookup: the same greedy output in fewer forward passes.

Editing and extraction answers copy long runs of their input; prompt lookup drafts those runs from the
prompt and the model checks a whole draft in one pass.  Run: python examples/speculative_decoding.py
"""

import time

import leapgen

CODE = """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    return subtotal * (1 + tax_rate)
"""

plain = leapgen.LLM()                    # the embedded SmolLM2-135M-Instruct
fast = leapgen.LLM(speculative={"method": "ngram", "num_speculative_tokens": 8,
                                "prompt_lookup_max": 4, "prompt_lookup_min": 2})
prompt = plain.chat_prompt(f"Rename total_price to compute_total. Reply with the code only.\n\n{CODE}")
params = leapgen.SamplingParams(max_tokens=96)

for name, llm in (("plain", plain), ("prompt lookup", fast)):
    start = time.perf_counter()
    out = llm.generate([prompt], params)[0]
    seconds = time.perf_counter() - start
    m = out.metrics
    print(f"{name:>13}: {len(out.token_ids)} tokens in {seconds:.2f}s, {m.forward_passes} forward passes, "
          f"{m.accepted_tokens}/{m.drafted_tokens} drafted tokens accepted")
print(out.text)
assert out.token_ids == plain.generate([prompt], params)[0].token_ids   # speculation never changes the output
