"""Python started in the repository root: the root's folders must not shadow installed packages."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_top_level_kernels_is_hugging_faces_not_the_roots_folder(tmp_path):
    """transformers imports Hugging Face's `kernels` once it is installed; from the root, `kernels/` (leapgen.kernels)
    came first and that import failed, so `LLM()` and `python -m leapgen.cli` broke there."""
    elsewhere = _run("import importlib.util; s = importlib.util.find_spec('kernels'); print(s.origin if s else '')",
                     tmp_path)
    assert elsewhere.returncode == 0, elsewhere.stderr
    installed = elsewhere.stdout.strip()
    code = ("import leapgen.kernels, sys\n"
            "try:\n    import kernels\n    print(kernels.__file__)\n"
            "except ModuleNotFoundError as e:\n    print('missing', e.name)\n"
            "print(leapgen.kernels.flash_attn_varlen.__module__)")
    here = _run(code, ROOT)
    assert here.returncode == 0, here.stderr
    top, ours = here.stdout.split("\n")[:2]
    assert top == (installed or "missing kernels")
    assert ours == "leapgen.kernels.dispatch"


def test_the_cli_runs_as_a_module_from_the_root():
    done = subprocess.run([sys.executable, "-m", "leapgen.cli", "generate", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "--max-tokens" in done.stdout
