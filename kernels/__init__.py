"""Attention and paged-cache kernels: Triton on CUDA, the torch reference elsewhere."""

from __future__ import annotations

if __name__ == "kernels":
    # Python started in the repository root finds this folder as the top-level `kernels` package, ahead of Hugging
    # Face's, which transformers imports once it is installed: hand over to that one.
    import importlib.util
    import sys
    from importlib.machinery import PathFinder
    from pathlib import Path

    _root = Path(__file__).resolve().parents[1]
    _spec = PathFinder.find_spec(__name__, [p for p in sys.path if Path(p or ".").resolve() != _root])
    if _spec is None:
        raise ModuleNotFoundError(f"No module named {__name__!r}", name=__name__)
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[__name__] = _module     # what the import statement returns, read back once this file has run
    _spec.loader.exec_module(_module)
else:
    from leapgen.kernels import reference
    from leapgen.kernels.dispatch import flash_attn_varlen, paged_decode_attention, store_kv

    __all__ = ["flash_attn_varlen", "paged_decode_attention", "store_kv", "reference"]
