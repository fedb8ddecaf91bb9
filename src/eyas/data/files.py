"""Conversation files on disk: a file, a folder or a glob of JSONL / JSON files, gzipped or not.

A folder means its ``.jsonl`` and ``.jsonl.gz`` files. A file is read as one JSON array of records
when its first non-blank character is ``[`` (the form ShareGPT and many others are published in),
else as JSON Lines, streamed a line at a time. Gzip is
recognised by its magic bytes, so ``.jsonl.gz`` and ``.json.gz`` need no flag. Each record becomes
``{"messages", "source"}`` where the source is the file's stem (``sharegpt-v3-pypi`` for
``sharegpt-v3-pypi.jsonl.gz``): that is the name per-source weights, caps and the summary use. A
record's own ``category`` is kept, and its own ``source`` (where a corpus took it from) as ``origin``.
"""

from __future__ import annotations

import glob
import gzip
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

from ..common.categories import category_of
from ..errors import EyasError
from .formats import normalize

SUFFIXES = (".jsonl", ".json")  # each also with .gz


def source_name(path) -> str:
    """``a/sharegpt-v3-pypi.jsonl.gz`` -> ``sharegpt-v3-pypi``."""
    name = Path(path).name
    name = name.removesuffix(".gz")
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _is_jsonl(path: Path) -> bool:
    return path.is_file() and path.name.removesuffix(".gz").endswith(".jsonl")


def resolve(spec: str) -> list[Path]:
    """The files a ``--input`` names: a file, every ``.jsonl``/``.jsonl.gz`` file of a folder (a
    folder's ``.json`` files are often metadata, so JSON arrays are named as files or by a glob), or
    a glob."""
    p = Path(spec)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if _is_jsonl(f))
        if not files:
            raise EyasError(f"{p} holds no .jsonl or .jsonl.gz files",
                            "pass a folder of JSONL files, a file (JSON arrays too), or a glob such as 'data/*.json'")
        return files
    if p.is_file():
        return [p]
    if glob.has_magic(spec):
        files = sorted(Path(f) for f in glob.glob(spec) if Path(f).is_file())
        if not files:
            raise EyasError(f"no file matches {spec}", "check the pattern (quote it so the shell leaves it alone)")
        return files
    raise EyasError(f"no such data file or folder: {p}",
                    "pass a JSONL/JSON file (gzipped or not), a folder of them, or a glob, of ShareGPT, "
                    "OpenAI messages, UltraChat or {'prompt': ...} records")


LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def mended(value):
    """``value`` (parsed JSON) with every lone UTF-16 surrogate (a ``\\ud800`` escape without its pair, as scraped
    chat dumps hold) replaced by U+FFFD: no UTF-8 text holds one, so tokenizers and writers would refuse it."""
    if isinstance(value, str):
        return LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [mended(v) for v in value]
    if isinstance(value, dict):
        return {mended(k): mended(v) for k, v in value.items()}
    return value


def loads(line: str):
    """``json.loads``, lone surrogates mended (``mended``; only a line with a ``\\u`` escape can hold one)."""
    value = json.loads(line)
    return mended(value) if "\\u" in line else value


def _open(path: Path):
    with path.open("rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    # utf-8-sig: a byte-order mark (what Windows tools write first) is read past, and absent is fine
    return gzip.open(path, "rt", encoding="utf-8-sig") if gz else path.open(encoding="utf-8-sig")


def read_objects(path) -> Iterator[tuple[str, object]]:
    """(``file:line`` or ``file[index]``, the parsed JSON value) for each record of one file; a file
    that is not UTF-8 or a cut gzip stream is an error naming the file and how far it was read."""
    path = Path(path)
    where = [0]
    try:
        yield from _objects(path, where)
    except UnicodeDecodeError as e:  # read in blocks: the bad byte is past the last line read whole
        at = f"after line {where[0]}" if where[0] else "in its first lines"
        raise EyasError(f"{path} is not UTF-8 text ({e.reason}, {at})",
                        "re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8 IN > OUT") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise EyasError(f"{path} is a damaged gzip file after line {where[0]} ({e})",
                        "the file was cut or corrupted: download or compress it again (gzip -t checks it)") from None


def _objects(path: Path, where: list[int]) -> Iterator[tuple[str, object]]:
    with _open(path) as f:
        first = True
        for n, line in enumerate(f, 1):
            where[0] = n
            if not line.strip():
                continue
            if first and line.lstrip().startswith("["):  # one JSON array
                try:
                    values = loads(line + f.read())
                except json.JSONDecodeError as e:
                    raise EyasError(f"{path} starts like a JSON array but is not valid JSON ({e.msg}, "
                                    f"line {e.lineno + n - 1})",
                                    "a JSON array of records, or one JSON object a line") from None
                for i, value in enumerate(values):
                    yield f"{path}[{i}]", value
                return
            first = False
            try:
                value = loads(line)
            except json.JSONDecodeError as e:
                raise EyasError(f"{path}:{n} is not valid JSON ({e.msg})", "one JSON object per line") from None
            yield f"{path}:{n}", value


def read_records(path) -> Iterator[dict]:
    """Every record of one file as ``{"messages", "source"[, "category", "origin"]}``."""
    source = source_name(path)
    for where, value in read_objects(path):
        rec = {"messages": normalize(value, where), "source": source}
        if isinstance(value, dict):
            if isinstance(value.get("category"), str):
                rec["category"] = value["category"]
            if isinstance(value.get("source"), str):
                rec["origin"] = value["source"]
        yield rec


def read_inputs(specs: list[str]) -> Iterator[dict]:
    """The records of every file the specs name, in order; two files of one stem are refused,
    since weights and the summary address a source by its stem."""
    seen: dict[str, Path] = {}
    files = [f for spec in specs for f in resolve(spec)]
    for f in files:
        name = source_name(f)
        if name in seen and seen[name].resolve() != f.resolve():
            raise EyasError(f"two inputs have the source name {name!r}: {seen[name]} and {f}",
                            "rename one of them: a source is addressed by its file's stem")
        seen[name] = f
    done = set()
    for f in files:
        if f.resolve() not in done:
            done.add(f.resolve())
            yield from read_records(f)


def nonblank_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, stripped text) of each non-blank line of a text file, gzipped or not (as ``eyas prepare``'s
    inputs)."""
    try:
        with _open(path) as f:
            return [(n, line.strip()) for n, line in enumerate(f.read().splitlines(), 1) if line.strip()]
    except UnicodeDecodeError as e:
        raise EyasError(f"{path} is not UTF-8 text ({e.reason})",
                        "re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8 IN > OUT") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise EyasError(f"{path} is a damaged gzip file ({e})", "compress it again (gzip -t checks it)") from None


def prompt_file_records(path: Path) -> list[tuple[list[dict], str | None]]:
    """(messages, category) of each prompt of a prompt file (``eyas eval --prompts``, ``--exclude``): JSON Lines
    of prompts or conversations, or plain text, one prompt a line."""
    lines = nonblank_lines(path)
    jsonl = bool(lines) and lines[0][1].startswith("{")  # JSON Lines, else one prompt a line
    out = []
    for n, line in lines:
        try:
            rec = loads(line)
        except json.JSONDecodeError as e:
            if jsonl:  # a broken record of a JSONL file was read as a text prompt, its JSON and all
                raise EyasError(f"{path}:{n} is not valid JSON ({e.msg})", "one JSON object per line") from None
            rec = line
        if not jsonl:
            rec = rec if isinstance(rec, str) else line  # a text line that parses as a number stays text
            out.append(([{"role": "user", "content": rec}], None))
        elif isinstance(rec, dict) and "prompt" in rec:
            out.append(([{"role": "user", "content": str(rec["prompt"])}], category_of(rec)))
        else:
            out.append((normalize(rec, f"{path}:{n}"), category_of(rec) if isinstance(rec, dict) else None))
    return out
