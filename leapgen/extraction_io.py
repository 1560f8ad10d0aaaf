"""Files of the extraction pipeline: input records with their ids, and the append-only output of finished ones.

Inputs are a .jsonl file (one object a line), a .csv file (a header row, then one record a row) or a
folder of .txt files (one record a file).  Every error names the file and line, and all of them come
before any work starts.

The output holds one JSON line per finished record.  Lines are written whole, one `write` each, so a
crash leaves at most a torn last line, which the next run cuts off; the ids already there are skipped,
and an id is never written twice.  Beside it, OUTPUT.run.json keeps the input and schema that wrote it: a resume
with others is refused.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leapgen.text_files import lone_surrogate, read_text

try:
    import fcntl
except ImportError:                  # Windows: no advisory locks; one writer at a time is then up to the user
    fcntl = None

JSONL_SUFFIXES = (".jsonl", ".ndjson")
RecordId = str | int


class InputError(ValueError):
    """Input that cannot run: the message names the file (and line) and what is wrong."""


class OutputError(ValueError):
    """An output file that cannot be resumed or written: the message names it and says why."""


@dataclass(frozen=True)
class Record:
    """One input record: its id, its fields (template placeholders) and where it was read (`file:line`)."""

    id: RecordId
    fields: dict[str, Any]
    where: str


def read_records(path: str | Path, id_field: str | None = None, text_field: str = "text") -> list[Record]:
    """The records of a .jsonl file, a .csv file or a folder of .txt files, with unique ids.

    `id_field` names the field holding each record's id; None: the "id" field when the records have one,
    else the line number (.jsonl, .csv: the line a row starts on) or the file name (folder, whose
    records hold each file's text in `text_field`).
    """
    path = Path(path)
    if path.is_dir():
        if id_field is not None:
            raise InputError(f"{path}: a folder's records are its .txt files and their ids the file names; "
                             f"id_field ({id_field!r}) does not apply")
        records = _read_folder(path, text_field)
    elif not path.exists():
        raise InputError(f"{path}: no such file or folder")
    elif path.suffix.lower() in JSONL_SUFFIXES:
        records = _with_ids(path, _read_jsonl(path), id_field)
        if not records:     # (a wrong path or a failed earlier step, nearly always: a run of nothing said nothing)
            raise InputError(f"{path}: no records; expected a JSON object per line")
    elif path.suffix.lower() == ".csv":
        records = _with_ids(path, _read_csv(path), id_field)
        if not records:
            raise InputError(f"{path}: no records; expected a row per record under the header")
    else:
        raise InputError(f"{path}: expected a .jsonl file, a .csv file or a folder of .txt files")
    _refuse_duplicates(records)
    return records


def _read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) for every non-blank line."""
    rows = []
    for number, line in enumerate(_read_text(path).split("\n"), 1):   # not splitlines: JSON may hold U+2028
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            at = "" if exc.msg.endswith(" at") else " at"    # ("Unterminated string starting at")
            raise InputError(f"{path}:{number}: not valid JSON ({exc.msg}{at} column {exc.colno})") from None
        except RecursionError:
            raise InputError(f"{path}:{number}: JSON nested too deeply to read") from None
        if not isinstance(value, dict):
            raise InputError(f"{path}:{number}: expected a JSON object, got {_json_type(value)}")
        rows.append((number, value))
    return rows


def _read_csv(path: Path) -> list[tuple[int, dict]]:
    """(line the row starts on, its fields) for every row after the header; empty cells are missing fields.
    Strict: a quote left open would otherwise take every row after it into one cell, silently."""
    reader = csv.reader(io.StringIO(_read_text(path), newline=""), strict=True)
    start = 1
    try:
        header = next(reader)
        twice = next((name for i, name in enumerate(header) if name in header[:i] and name != ""), None)
        if twice is not None:        # (one cell of the two would be lost)
            raise InputError(f"{path}:1: the header names the column {twice!r} twice")
        unnamed = [i for i, name in enumerate(header) if name == ""]
        rows, start = [], reader.line_num + 1
        for cells in reader:
            if any(cells[len(header):]):     # (empty ones past the header, a trailing comma, lose nothing)
                raise InputError(f"{path}:{start}: {len(cells)} cells in a row under a header of {len(header)} "
                                 "columns (a comma in a field that is not quoted?)")
            filled = [i + 1 for i in unnamed if i < len(cells) and cells[i]]
            if len(filled) > 1:              # (empty trailing columns are fine)
                raise InputError(f"{path}:{start}: cells under columns {filled[0]} and {filled[1]}, which the header "
                                 "does not name; name them")
            if any(cells):
                rows.append((start, {name: cell for name, cell in zip(header, cells) if cell != ""}))
            start = reader.line_num + 1
    except StopIteration:
        raise InputError(f"{path}: empty; expected a header row naming the columns") from None
    except csv.Error as exc:
        opened = f" (in the row from line {start})" if reader.line_num > start else ""
        raise InputError(f"{path}:{reader.line_num}: {exc}{opened}") from None
    return rows


def _read_folder(path: Path, text_field: str) -> list[Record]:
    files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".txt" and p.is_file())
    if not files:
        raise InputError(f"{path}: no .txt files in this folder")
    for file in files:
        found = lone_surrogate(file.name)
        if found is not None:
            shown = os.fsencode(file.name).decode("utf-8", "backslashreplace")
            raise InputError(f"{path / shown}: the file name, its record's id, is not UTF-8 ({found}); rename the file")
    return [Record(file.name, {text_field: _read_text(file)}, str(file)) for file in files]


def _with_ids(path: Path, rows: list[tuple[int, dict]], id_field: str | None) -> list[Record]:
    field = id_field if id_field is not None else ("id" if any("id" in fields for _, fields in rows) else None)
    return [Record(_record_id(fields, field, number, f"{path}:{number}"), fields, f"{path}:{number}")
            for number, fields in rows]


def _record_id(fields: dict, field: str | None, number: int, where: str) -> RecordId:
    if field is None:
        return number
    if field not in fields:
        raise InputError(f"{where}: no {field!r} field (the id field)")
    value = fields[field]
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise InputError(f"{where}: the id field {field!r} must be a non-empty string or an integer, got {value!r}")
    found = lone_surrogate(value) if isinstance(value, str) else None
    if found is not None:        # (JSON's \udc80 escape reads as one; the output, UTF-8, could not hold it)
        raise InputError(f"{where}: the id {value!r} holds a lone surrogate ({found}), which no UTF-8 text can; ids "
                         "must be Unicode text")
    return value


def _refuse_duplicates(records: list[Record]) -> None:
    first: dict[RecordId, str] = {}
    for record in records:
        if record.id in first:
            raise InputError(f"{record.where}: duplicate id {record.id!r} (first at {first[record.id]})")
        first[record.id] = record.where


def _read_text(path: Path) -> str:
    try:
        return read_text(path, byte_order_mark=True)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _json_type(value: Any) -> str:
    names = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "an array"}
    return names.get(type(value), type(value).__name__)


def refuse_input_as_output(input: str | Path, output: str | Path) -> None:
    """OutputError when `output` is the input file itself (by any path or link to it): its records would
    count as finished ones, or appending would change the input."""
    try:
        same = os.path.samefile(input, output)
    except OSError:                  # the output does not exist yet (or cannot be read: read_finished says so)
        return
    if same:
        raise OutputError(f"{output}: this is the input file {input}; choose another output file")


def read_finished(path: str | Path, retry_errors: bool = False) -> set[RecordId]:
    """The ids already in an output file (none when it does not exist yet); a torn last line does not count,
    nor with `retry_errors` a line whose status is "error".  OutputError when it cannot be read, another run is
    writing it, its folder does not exist, or a line is not one extract writes."""
    path = Path(path)
    if not path.parent.is_dir():
        raise OutputError(f"{path}: no folder {path.parent} to write it in")
    if str(path) == "-":
        raise OutputError("-: the output is appended to and read back to resume, so it is a file, not standard "
                          "output (give a file name)")
    if path.exists() and not path.is_file():     # a pipe blocks the read, /dev/zero never ends it
        raise OutputError(f"{path}: not a regular file; the output is appended to and read back to resume, so it "
                          "must be one (write to a file, then copy it where it goes)")
    try:
        with open(path, "rb") as file:
            _lock(file, path, probe=True)    # a run writing it already is named before any model loads
            data = file.read()
    except FileNotFoundError:
        return set()
    except OSError as exc:
        raise OutputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    return _ids_in(path, data[:data.rfind(b"\n") + 1], retry_errors)


def run_record_path(output: str | Path) -> Path:
    """Where the input and schema that wrote `output` are kept: `OUTPUT.run.json` beside it."""
    output = Path(output)
    return output.with_name(output.name + ".run.json")


def check_same_run(output: str | Path, run: dict[str, Any]) -> bool:
    """Whether `run` (its `input` and `schema`) is to be kept beside `output`: yes where the output holds no line
    yet or a record of the same run, no where it holds lines without a record (written before they were kept: taken
    as is, since what wrote them is not known).  OutputError when its lines came from another input or schema: a
    resume would skip the new input's records under the old ones' ids, or keep lines the new schema does not
    validate."""
    output = Path(output)
    if not output.is_file() or output.stat().st_size == 0:
        return True
    record = run_record_path(output)
    try:
        known = json.loads(record.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return False
    except (OSError, ValueError) as exc:
        raise OutputError(f"{record}: cannot read the run record of {output} ({exc}); remove it to resume as is")
    for key in ("input", "schema"):
        if isinstance(known, dict) and key in known and known[key] != run[key]:
            raise OutputError(f"{output}: its lines came from another {key} ({record} names it); resume with the "
                              f"same {key}, write to another output, or remove {record.name} to resume as is")
    return True


def write_run_record(output: str | Path, run: dict[str, Any]) -> None:
    """Keep `run` (its input and schema) beside `output`, whole or not at all."""
    record = run_record_path(output)
    partial = record.with_name(record.name + ".partial")
    partial.write_text(json.dumps(run, indent=1) + "\n", encoding="ascii")    # (a path's undecodable bytes too)
    os.replace(partial, record)


def _lock(file: Any, path: Path, probe: bool = False) -> None:
    """Lock `file` for this process alone; OutputError when another run holds it.  With `probe`, only check that
    none does: a shared lock, released at once (it needs no write access, which NFS asks of an exclusive one, and
    held through a read it would refuse a writer starting meanwhile)."""
    if fcntl is None:
        return
    try:
        fcntl.flock(file.fileno(), (fcntl.LOCK_SH if probe else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        if probe:
            fcntl.flock(file.fileno(), fcntl.LOCK_UN)
    except BlockingIOError:
        raise OutputError(f"{path}: another run is writing to it; wait for it or choose another output file") from None


# The keys of every line extract writes: an "id" alone is as likely an input record (a .jsonl of documents
# given as the output), whose ids would silently count as finished.
RESULT_KEYS = ("id", "status", "data", "error")


def _ids_in(path: Path, whole_lines: bytes, skip_errors: bool = False) -> set[RecordId]:
    ids: set[RecordId] = set()
    for number, line in enumerate(whole_lines.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:             # not JSON, or not UTF-8
            value = None
        if not _is_result_line(value):
            raise OutputError(f"{path}:{number}: not a line of leapgen extract's output (a JSON object with "
                              f"\"id\", \"status\" \"ok\" or \"error\", \"data\" and \"error\"); refusing to "
                              f"append to it, choose another output file")
        if not (skip_errors and value["status"] == "error"):
            ids.add(value["id"])
    return ids


def _is_result_line(value: Any) -> bool:
    if not isinstance(value, dict) or any(key not in value for key in RESULT_KEYS):
        return False
    record_id = value["id"]
    return (isinstance(record_id, (str, int)) and not isinstance(record_id, bool)
            and value["status"] in ("ok", "error"))


class OutputWriter:
    """Appends output lines to a file, locked against a second writer.

    Opening cuts off a torn last line (a crash mid-write), with `retry_errors` takes out the error lines, and
    reads the ids already written; `write` skips those, so no id is written twice.  Each line is one write,
    flushed at once (a killed process loses no finished line); fsync runs at the line that makes `sync_every`
    lines or comes `sync_seconds` after the last fsync, and on close, so a power cut loses at most that much,
    which the next run redoes.
    """

    def __init__(self, path: str | Path, sync_every: int = 64, sync_seconds: float = 1.0,
                 retry_errors: bool = False) -> None:
        self.path = Path(path)
        self.retry_errors = retry_errors
        self.dropped_errors = 0          # error lines taken out to run their records again (retry_errors)
        self.sync_every, self.sync_seconds = sync_every, sync_seconds
        self.finished: set[RecordId] = set()
        self.repaired_bytes = 0          # length of the torn last line cut off on opening
        self._file = None
        self._unsynced, self._synced_at = 0, time.monotonic()

    def __enter__(self) -> OutputWriter:
        try:
            self._file = open(self.path, "a+b")
        except OSError as exc:
            raise OutputError(f"{self.path}: cannot write it ({exc.strerror or exc})") from None
        try:
            _lock(self._file, self.path)
            self._file.seek(0)
            data = self._file.read()
            whole = data.rfind(b"\n") + 1
            self.finished = _ids_in(self.path, data[:whole])
            if whole < len(data):
                self._file.truncate(whole)
                self.repaired_bytes = len(data) - whole
                self.sync()
            if self.retry_errors:
                self._drop_error_lines(data[:whole])
        except BaseException:
            self._file.close()
            raise
        return self

    def _drop_error_lines(self, whole: bytes) -> None:
        """Take the error lines out, so their records run again: the kept lines go to a new file renamed over
        the output, so a crash leaves one whole file or the other."""
        lines = [line for line in whole.splitlines(keepends=True) if line.strip()]
        kept = [line for line in lines if json.loads(line).get("status") != "error"]
        if len(kept) == len(lines):
            return
        fresh = self.path.with_name(self.path.name + ".retry")
        with open(fresh, "wb") as out:
            out.write(b"".join(kept))
            out.flush()
            os.fsync(out.fileno())
        os.replace(fresh, self.path)
        self._file.close()
        self._file = open(self.path, "a+b")
        _lock(self._file, self.path)
        self.finished = _ids_in(self.path, b"".join(kept))
        self.dropped_errors = len(lines) - len(kept)

    def write(self, line: dict[str, Any]) -> bool:
        """Append one output line (a dict with an "id"); False, writing nothing, when its id is there already."""
        if line["id"] in self.finished:
            return False
        try:
            text = json.dumps(line, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:   # a lone surrogate in an error's message: written escaped, as JSON may
            text = json.dumps(line).encode("ascii")
        self._file.write(text + b"\n")
        self._file.flush()
        self.finished.add(line["id"])
        self._unsynced += 1
        if self._unsynced >= self.sync_every or time.monotonic() - self._synced_at >= self.sync_seconds:
            self.sync()
        return True

    def sync(self) -> None:
        """Make what was written durable (fsync)."""
        os.fsync(self._file.fileno())
        self._unsynced, self._synced_at = 0, time.monotonic()

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.sync()
        finally:
            self._file.close()           # closing releases the lock
