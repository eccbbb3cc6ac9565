"""Raw records from data files and Hub datasets, each with where it came from (`file:line`,
`file:row`, `org/name[subset/split]:row`).

Sources, chosen by the path:
- a Hugging Face dataset id (`openai/gsm8k`, not an existing path), with a subset and a split
  (`test[:5%]` slicing allowed): through `datasets.load_dataset`, whose cache, `HF_HOME`,
  `HF_HUB_OFFLINE` and token handling are used as they are;
- `*.parquet`, `*.csv`, `*.arrow` and a folder written by `datasets`' `save_to_disk`: through
  `datasets` too (`load_dataset("parquet" | "csv" | "arrow", ...)`, `load_from_disk`); rows
  numbered from 1;
- `*.jsonl` (and any other file): one JSON object per line, read here, because this reader is
  what names the line of a malformed record (`file:line`) — `datasets` reports neither; a line
  longer than `MAX_LINE_BYTES` is refused as it is read, naming the field it was in when the
  bound was passed, so one enormous line never has to be held whole;
- `*.json` (an array of objects, or one object) and any other folder (every `*.json` below it,
  sorted: the official MATH layout, one problem per file): read here for the same reason, and
  because `datasets` would build one dataset per file for a folder of 7,500 one-problem files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from reasonrl.errors import DataError


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        raise DataError("reading Parquet / Arrow data needs pyarrow: pip install pyarrow") from None
    return pyarrow


def _not_utf8(where: str, err: UnicodeDecodeError, column: int, offset: int) -> DataError:
    """The DataError of bytes that are not UTF-8: `where` (file:line), the first bad byte, its
    column (in bytes) and its offset in the file, and what to do."""
    bad = err.object[err.start:err.start + 1].hex()
    return DataError(f"{where}: not UTF-8 text (byte 0x{bad} at column {column}, byte offset {offset} "
                     "of the file); data files must be UTF-8: convert it, e.g. with "
                     "`iconv -f <its encoding> -t utf-8`")


# The longest JSONL line read (bytes): far above any record a run can train on (a prompt is held
# to data.max_prompt_tokens, `files.prompt_byte_limit`), and what a line costs to hold while it is
# parsed (the bytes, their text and the record: about 3x) stays a few hundred MB.
MAX_LINE_BYTES = 64 << 20

_STRUCTURE = re.compile(rb'["{}\[\],]')


def _field_at_end(prefix: bytes) -> str:
    """The field a JSON record cut short at the end of `prefix` was in there, as a dotted path
    (`prompt`, `messages[2].content`, `extra_info.tests[0]`), or "" at the top level: the
    containers still open and, in each object, the last key seen."""
    path: list[list] = []  # per open container: ["obj", key or None, expecting a key] | ["arr", index]
    pos = 0
    while (m := _STRUCTURE.search(prefix, pos)) is not None:
        char, pos = prefix[m.start():m.start() + 1], m.start() + 1
        if char == b'"':
            end = pos
            while True:  # the closing quote: one not escaped by an odd run of backslashes
                end = prefix.find(b'"', end)
                if end < 0:
                    break
                start = end
                while start > pos and prefix[start - 1] == 0x5C:  # the backslashes just before it
                    start -= 1
                if (end - start) % 2 == 0:
                    break
                end += 1
            if end < 0:  # the string runs past the end: a key being read, or the value of the key last seen
                break
            if path and path[-1][0] == "obj" and path[-1][2]:
                path[-1][1], path[-1][2] = prefix[pos:end][:200].decode("utf-8", "replace"), False
            pos = end + 1
        elif char in b"{[":
            path.append(["obj", None, True] if char == b"{" else ["arr", 0])
        elif char in b"}]":
            if path:
                path.pop()
        elif path:  # a comma: the next key, or the next item
            if path[-1][0] == "obj":
                path[-1][2] = True
            else:
                path[-1][1] += 1
    field = ""
    for entry in path:
        if entry[0] == "arr":
            field += f"[{entry[1]}]"
        elif entry[1] is not None:
            field += f".{entry[1]}" if field else entry[1]
    return field


def _too_long(where: str, prefix: bytes, limit: int) -> DataError:
    field = _field_at_end(prefix)
    what = f"field '{field}' passes" if field else "it passes"
    return DataError(f"{where}: line longer than {limit:,} bytes ({what} that bound); refused before it is "
                     f"read whole. A record that long cannot be trained on: shorten or drop it")


def _jsonl(path: Path) -> Iterator[tuple[str, object]]:
    offset, max_line_bytes = 0, MAX_LINE_BYTES  # offset: of the line in the file, in bytes
    with path.open("rb") as f:  # decoded line by line: a bad byte is reported with its line
        for lineno, raw in enumerate(iter(lambda: f.readline(max_line_bytes + 1), b""), start=1):
            where = f"{path}:{lineno}"
            if len(raw) - raw.endswith(b"\n") > max_line_bytes:  # read no further than the bound (+ 1 byte)
                raise _too_long(where, raw, max_line_bytes)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise _not_utf8(where, err, err.start + 1, offset + err.start) from None
            offset += len(raw)
            if not line.strip():
                continue
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None


def _json(path: Path) -> Iterator[tuple[str, object]]:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = raw.rfind(b"\n", 0, err.start) + 1
        lineno = raw.count(b"\n", 0, err.start) + 1
        raise _not_utf8(f"{path}:{lineno}", err, err.start - line_start + 1, err.start) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
    if isinstance(data, list):
        for i, record in enumerate(data, start=1):
            yield f"{path}:item {i}", record
    else:
        yield f"{path}:1", data


def _rows(dataset, origin: str) -> Iterator[tuple[str, object]]:
    for i, record in enumerate(dataset, start=1):
        yield f"{origin}:{i}", record


def _datasets():
    try:
        import datasets
    except ImportError:  # pragma: no cover - a dependency
        raise DataError("reading Parquet, CSV, Arrow and Hub data needs `datasets`: "
                        "pip install datasets") from None
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    return datasets


KINDS = {"parquet": "Parquet", "csv": "CSV", "arrow": "Arrow"}


def _local_table(path: Path, kind: str) -> Iterator[tuple[str, object]]:
    """A Parquet / CSV / Arrow file through `datasets` (one split, "train")."""
    datasets = _datasets()
    try:
        dataset = datasets.load_dataset(kind, data_files=str(path), split="train")
    except Exception as err:  # datasets raises many kinds for a file it cannot read
        raise DataError(f"{path}: not a readable {KINDS[kind]} file ({type(err).__name__}: {err})") from None
    yield from _rows(dataset, str(path))


def _saved_dataset(folder: Path) -> Iterator[tuple[str, object]]:
    """A `save_to_disk` folder (one split)."""
    datasets = _datasets()
    try:
        dataset = datasets.load_from_disk(str(folder))
    except Exception as err:
        raise DataError(f"{folder}: not a readable datasets save_to_disk folder ({err})") from None
    yield from _rows(dataset, str(folder))


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".arrow", ".txt")


def is_hub_id(path: str) -> bool:
    """A name that is not an existing path and reads like a Hub dataset id (`org/name`)."""
    return (not Path(path).exists() and bool(HUB_ID.match(path))
            and not path.lower().endswith(LOCAL_SUFFIXES))


def hub_records(repo_id: str, subset: str = "", split: str = "train") -> Iterator[tuple[str, object]]:
    """The records of a Hub dataset's `subset` and `split` (slicing such as `test[:5%]` allowed)
    through `datasets.load_dataset`; a missing dataset, subset or split is a DataError naming it
    (and, where `datasets` says, what exists)."""
    from reasonrl.cache import hub_unreachable

    datasets = _datasets()
    origin = f"{repo_id}[{subset + '/' if subset else ''}{split}]"
    local = f"no local file or folder {Path(repo_id).resolve()} either"
    offline = datasets.config.HF_HUB_OFFLINE
    unreachable = None if offline else hub_unreachable()  # then the cache alone, as HF_HUB_OFFLINE=1
    try:
        datasets.config.HF_HUB_OFFLINE = offline or unreachable is not None
        dataset = datasets.load_dataset(repo_id, subset or None, split=split)
    except ConnectionError as err:  # offline and not in the cache
        hub = "not asked, HF_HUB_OFFLINE is set" if offline else unreachable or f"no answer ({err})"
        way = "" if offline else "; without network, set HF_HUB_OFFLINE=1 to go to the cache at once"
        raise DataError(f"{origin}: not found; tried (1) a local file or folder {Path(repo_id).resolve()}: "
                        f"none there; (2) the datasets cache {datasets.config.HF_DATASETS_CACHE}: not in it; "
                        f"(3) the Hub: {hub}. Load it once online with the same HF_HOME, or give a local "
                        f"file (a path that exists is read as a file, never as a Hub id){way}") from None
    except datasets.exceptions.DatasetNotFoundError as err:
        raise DataError(f"{origin}: no such dataset on the Hugging Face Hub ({err}), and {local}") from None
    except ValueError as err:  # an unknown split or subset: datasets lists the ones that exist
        raise DataError(f"{origin}: {err}") from None
    finally:
        datasets.config.HF_HUB_OFFLINE = offline
    if isinstance(dataset, dict):  # a DatasetDict: the split name was not one split
        raise DataError(f"{origin}: give one split (data.*_split), e.g. {', '.join(dataset)}")
    yield from _rows(dataset, origin)


def iter_records(path: str | Path, subset: str = "", split: str = "train") -> Iterator[tuple[str, object]]:
    """(where, record) for every record of `path` (a file, a folder, or a Hub dataset id with
    `subset` and `split`); DataError if it cannot be read."""
    if isinstance(path, str) and is_hub_id(path):
        yield from hub_records(path, subset, split)
        return
    path = Path(path)
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():
            splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
            raise DataError(f"{path}: a DatasetDict with splits {', '.join(splits)}; "
                            f"point at one split, e.g. {path / (splits[0] if splits else 'train')}")
        if (path / "state.json").is_file():
            yield from _saved_dataset(path)
            return
        files = sorted(path.rglob("*.json"))
        if not files:
            raise DataError(f"{path}: folder holds no *.json files and no save_to_disk dataset")
        for file in files:
            yield from _json(file)
        return
    if not path.is_file():
        raise DataError(f"{path}: data file does not exist (make one with `reasonrl data prepare`, or "
                        "give a Hub dataset id like openai/gsm8k)")
    if path.suffix in (".parquet", ".csv", ".arrow"):
        yield from _local_table(path, path.suffix[1:])
    elif path.suffix == ".json":
        yield from _json(path)
    else:
        yield from _jsonl(path)


def write_records(records: list[dict], path: str | Path) -> None:
    """Write records as JSONL, or as Parquet when `path` ends in .parquet."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pa = _pyarrow()
        # pa.array infers one struct type over all records (Table.from_pylist: the first only)
        pa.parquet.write_table(pa.Table.from_struct_array(pa.array(records)), path)
        return
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
