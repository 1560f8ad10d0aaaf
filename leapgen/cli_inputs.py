"""What `leapgen generate` and `leapgen sweep` read alike: the prompts (--prompt, --prompts-file, stdin), the
text flags (--stop's escapes, undecodable argv) and the output constraint (--schema, --regex, ...), each
checked before the model loads so that bad input fails fast, in one line naming the flag."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Sequence

from leapgen.cli_common import CliError, describe
from leapgen.text_files import lone_surrogate, parse_json, read_text


def add_prompt_arguments(parser: argparse.ArgumentParser) -> None:
    """--prompt, --prompts-file, --chat and --system."""
    parser.add_argument("--prompt", action="append", default=[], help="prompt text; repeat for a batch")
    parser.add_argument("--prompts-file", metavar="FILE",
                        help="more prompts (after the --prompt ones): one a line, blank lines skipped, or JSONL "
                             "with a \"prompt\" field in each line's object; '-' reads standard input")
    parser.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    parser.add_argument("--system", help="system message (implies --chat)")


def add_stop_argument(parser: argparse.ArgumentParser) -> None:
    """--stop, repeatable, with the escapes a shell passes through literally."""
    parser.add_argument("--stop", action="append",
                        help=r"stop string; repeat for several; escapes such as \n, \t, \\ and \u00e9 are decoded")


def add_constraint_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of an output constraint, at most one of them."""
    constraint = parser.add_mutually_exclusive_group()
    constraint.add_argument("--schema", metavar="FILE|module:Model",
                            help="constrain output to this JSON schema file or pydantic model class "
                                 "('pkg.module:Model' or 'path/to/file.py:Model')")
    constraint.add_argument("--json-schema", metavar="FILE", help="the same as --schema")
    constraint.add_argument("--response-format", metavar="JSON_OR_FILE",
                            help="constrain output as OpenAI's response_format does, given inline "
                                 "('{\"type\": \"json_object\"}') or as a JSON file")
    constraint.add_argument("--regex", help="constrain output to match this regex ('' means empty output)")
    constraint.add_argument("--grammar", metavar="FILE", help="constrain output to this lark grammar file")


# --- text flags and prompts ----------------------------------------------------------------------------

def prepare_text_flags(args: argparse.Namespace) -> None:
    """Check the text flags and put in place what they mean: --stop with its escapes decoded, and in
    `args.prompt` every prompt, --prompt's then --prompts-file's (CliError when there is none)."""
    if args.stop is not None:
        try:
            args.stop = [decode_escapes(s) for s in args.stop]
        except ValueError as exc:
            raise CliError(f"--stop: {exc}") from None
    for flag, values in (("--prompt", args.prompt), ("--system", [args.system] if args.system is not None else []),
                         ("--stop", args.stop or []), ("--regex", [args.regex] if args.regex is not None else [])):
        check_utf8(flag, values)
    if args.prompts_file is not None:
        args.prompt = args.prompt + read_prompts_file(args.prompts_file)
    if not args.prompt:
        empty = f" (--prompts-file {args.prompts_file} has none)" if args.prompts_file is not None else ""
        raise CliError(f"no prompt: give --prompt TEXT or --prompts-file FILE{empty}")


def read_prompts_file(path: str) -> list[str]:
    """The prompts of --prompts-file `path` ('-': standard input)."""
    where = f"--prompts-file {path}"
    text = _read_stdin(where) if path == "-" else _read_text("--prompts-file", path, byte_order_mark=True)
    return parse_prompts(where, text)


def parse_prompts(where: str, text: str) -> list[str]:
    """The prompts of a prompts file's text (`where` names it in errors): JSONL when every non-blank line is a
    JSON object, or the first is one with a "prompt" (then a line that is not is an error, not a prompt), each
    with a "prompt" string; otherwise one prompt a line."""
    # not splitlines(): it also splits at U+2028 and other characters that a prompt may hold
    lines = [(number, line.removesuffix("\r")) for number, line in enumerate(text.split("\n"), 1)]
    lines = [(number, line) for number, line in lines if line.strip()]
    objects = [_json_object(line) for _, line in lines]
    if not lines or any(obj is None for obj in objects) and (objects[0] is None or "prompt" not in objects[0]):
        return [line for _, line in lines]
    prompts = []
    for (number, _), obj in zip(lines, objects):
        if obj is None:
            raise CliError(f"{where}:{number}: not a JSON object (the file reads as JSONL, one object a line: its "
                           f"first line is one with a \"prompt\")")
        if "prompt" not in obj:
            raise CliError(f"{where}:{number}: the object has no \"prompt\" field (in a JSONL prompts file "
                           f"every line has one)")
        if not isinstance(obj["prompt"], str):
            raise CliError(f"{where}:{number}: \"prompt\" must be a string, got {type(obj['prompt']).__name__}")
        check_utf8(f"{where}:{number}", [obj["prompt"]])         # JSON's \udcff escapes get past the decoder
        prompts.append(obj["prompt"])
    return prompts


def _json_object(line: str) -> dict | None:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _read_stdin(where: str) -> str:
    if sys.stdin is None:
        raise CliError(f"{where}: there is no standard input")
    # the bytes underneath, to refuse what is not UTF-8 whatever the locale; a text stream put in stdin's
    # place (by a program embedding leapgen) has none and is taken as it is
    data = getattr(sys.stdin, "buffer", sys.stdin).read()
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CliError(f"{where}: standard input is not UTF-8 text (byte offset {exc.start})") from None


def chat_prompts(llm, args: argparse.Namespace) -> list[str]:
    """The prompts in the chat template (a system message is only meaningful there, so it implies --chat)."""
    try:
        return [llm.chat_prompt(p, args.system) for p in args.prompt]
    except ValueError as exc:        # e.g. a tokenizer without a chat template
        raise CliError(f"{'--system' if args.system is not None else '--chat'}: {exc}") from None


_ESCAPE = re.compile(r"\\(?:([\\nrt0abfv'\"])|x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))")
_SIMPLE_ESCAPES = {"\\": "\\", "n": "\n", "r": "\r", "t": "\t", "0": "\0", "a": "\a", "b": "\b", "f": "\f",
                   "v": "\v", "'": "'", '"': '"'}


def decode_escapes(text: str) -> str:
    r"""`text` with the backslash escapes a shell passes through literally decoded (\n, \t, \\, \xNN,
    \uNNNN, \UNNNNNNNN ...); other backslashes and non-ASCII text stay as they are.  ValueError for an
    escape past the last code point."""
    def replace(match: re.Match) -> str:
        simple, *hex_digits = match.groups()
        if simple is not None:
            return _SIMPLE_ESCAPES[simple]
        code = int(next(h for h in hex_digits if h is not None), 16)
        if code > sys.maxunicode:
            raise ValueError(f"escape {match.group(0)!r} is past the last Unicode code point")
        return chr(code)

    return _ESCAPE.sub(replace, text)


def check_utf8(flag: str, values: Sequence[str]) -> None:
    """Python hands undecodable argv bytes over as lone surrogates; no tokenizer can take them."""
    for number, value in enumerate(values, 1):
        found = lone_surrogate(value)
        if found is None:
            continue
        where = flag if len(values) == 1 else f"{flag} #{number}"
        raise CliError(f"{where}: the text is not valid UTF-8 ({found}); check the terminal's or the file's encoding")


# --- the constraint --------------------------------------------------------------------------------------

def constraint(args: argparse.Namespace) -> tuple[str, Any] | tuple[None, None]:
    """The constraint spec and the flag that gave it; `is not None`, since `--regex ''` means empty output.
    --ignore-eos and --min-tokens beside a constraint are refused: the constraint ends the text, with eos."""
    flag, spec = _constraint(args)
    for name in ("--ignore-eos", "--min-tokens"):
        if spec is not None and getattr(args, name[2:].replace("-", "_"), None):
            raise CliError(f"{name} cannot be combined with {flag.split()[0]}: the constraint decides where the text "
                           "ends, with eos")
    return flag, spec


def _constraint(args: argparse.Namespace) -> tuple[str, Any] | tuple[None, None]:
    from leapgen.constraints import Grammar, Regex

    for flag, source in (("--schema", args.schema), ("--json-schema", args.json_schema)):
        if source is not None:
            return f"{flag} {source}", _schema(flag, source)
    if args.response_format is not None:
        return _response_format(args.response_format)
    if args.regex is not None:
        return "--regex", Regex(args.regex)
    if args.grammar is not None:
        return f"--grammar {args.grammar}", Grammar(_read_text("--grammar", args.grammar))
    return None, None


def _read_text(flag: str, path: str, byte_order_mark: bool = False) -> str:
    try:
        return read_text(path, byte_order_mark=byte_order_mark)
    except ValueError as exc:        # its messages start with the path
        raise CliError(f"{flag} {exc}") from None


def _read_json(flag: str, path: str) -> Any:
    return _parse_json(f"{flag} {path}", _read_text(flag, path))


def _parse_json(where: str, text: str) -> Any:
    try:
        return parse_json(where, text)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _schema(flag: str, source: str) -> Any:
    """--schema's spec: a JSON Schema file, or a pydantic model class named `module:Model` or `file.py:Model`."""
    from leapgen.constraints import JsonSchema, checked_schema, load_schema

    if ":" not in source:            # surely a file: read it with the messages every file flag gives
        try:
            return JsonSchema(checked_schema(f"{flag} {source}", _read_json(flag, source)))
        except ValueError as exc:
            raise CliError(str(exc)) from None
    try:
        return JsonSchema(load_schema(source))
    except ValueError as exc:        # load_schema's messages start with the source
        raise CliError(f"{flag} {exc}") from None
    except Exception as exc:         # the user's module failed while it was imported (SyntaxError, ...)
        raise CliError(f"{flag} {source}: importing it failed: {describe(exc)}") from None


def _response_format(text: str) -> tuple[str, Any]:
    """--response-format's spec, from inline JSON or a JSON file, with the flag (and file) that gave it."""
    from leapgen.constraints import from_response_format

    inline = text.lstrip().startswith("{")
    where = "--response-format" if inline else f"--response-format {text}"
    value = _parse_json(where, text) if inline else _read_json("--response-format", text)
    try:
        return where, from_response_format(value)
    except ValueError as exc:
        raise CliError(f"{where}: {exc}") from None
