"""Reading the text and JSON files users name (schemas, grammars, templates, inputs), with errors that say
which file and what is wrong, one line each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_text(path: str | Path, *, byte_order_mark: bool = False) -> str:
    """The UTF-8 text of `path` (`byte_order_mark`: drop a leading BOM, as spreadsheets write one);
    ValueError "PATH: no such file" / "is a directory" / "not UTF-8 text" / "cannot read it"."""
    try:
        return Path(path).read_text(encoding="utf-8-sig" if byte_order_mark else "utf-8")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a file") from None
    except UnicodeDecodeError as exc:
        line = exc.object.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text (byte offset {exc.start})") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def lone_surrogate(text: str) -> str | None:
    """Where `text` holds a character no UTF-8 encodes, a lone surrogate (Python hands an undecodable byte of argv or
    of a file name over as one), said as "byte 0xe9 at character 3"; None for Unicode text."""
    bad = next((i for i, ch in enumerate(text) if 0xD800 <= ord(ch) <= 0xDFFF), None)
    if bad is None:
        return None
    code = ord(text[bad])
    what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"lone surrogate U+{code:04X}"
    return f"{what} at character {bad}"


def parse_json(where: str, text: str) -> Any:
    """`text` as JSON; ValueError naming `where` when it is not valid or nests too deeply to read."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply to read") from None
