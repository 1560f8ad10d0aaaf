"""On a GPU: decode steps replayed from CUDA graphs against the same steps launched kernel by kernel.

The engine records one graph per padded batch size (1, 2, 4, 8, then multiples of 16) the first time a decode
step of that size runs, so the first call pays the recording; later calls replay.  Outputs are the same either way.
Run: python examples/gpu_decode.py [CHECKPOINT_DIR_OR_GGUF]   (default: the embedded SmolLM2-135M-Instruct)
"""

import sys
import time

import leapgen
import torch

if not torch.cuda.is_available():
    print("no CUDA GPU here: CUDA graphs apply on a GPU only (on CPU the engine runs as always)")
    sys.exit(0)

model = sys.argv[1] if len(sys.argv) > 1 else None
prompts = [f"Write a short story about a lighthouse keeper, part {i}." for i in range(8)]
params = leapgen.SamplingParams(max_tokens=128, ignore_eos=True)

for graphs in (True, False):
    llm = leapgen.LLM(model, dtype="bfloat16", device="cuda", kv_cache_memory="2GiB", cuda_graphs=graphs)
    llm.generate(prompts, leapgen.SamplingParams(max_tokens=4))          # warm-up: kernels compile, graphs record
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outputs)
    print(f"cuda_graphs={graphs}: {tokens / seconds:.0f} tok/s over {len(prompts)} prompts; "
          f"first output: {outputs[0].text[:60]!r}")
    del llm
    torch.cuda.empty_cache()
