"""Raw records from data files, each with where it came from (`file:line` or `file:row`).

Formats, chosen by the path:
- `*.jsonl` (or anything else that is a file): one JSON object per line, blank lines skipped;
- `*.json`: one JSON array of objects (or a single object);
- `*.parquet`: a Parquet table (pyarrow), one record per row;
- a folder written by `datasets.Dataset.save_to_disk` (state.json + Arrow files), read with
  pyarrow alone: the `datasets` package is not needed;
- any other folder: every `*.json` file below it, in sorted order (the official MATH layout,
  `train/algebra/1.json`, one problem per file).

Parquet and Arrow rows are numbered from 1 like lines, so `data.parquet:12` is the 12th row.
"""

from __future__ import annotations

import json
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


def _jsonl(path: Path) -> Iterator[tuple[str, object]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None


def _json(path: Path) -> Iterator[tuple[str, object]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
    if isinstance(data, list):
        for i, record in enumerate(data, start=1):
            yield f"{path}:item {i}", record
    else:
        yield f"{path}:1", data


def _table_rows(table, path: Path) -> Iterator[tuple[str, object]]:
    for i, record in enumerate(table.to_pylist(), start=1):
        yield f"{path}:{i}", record


def _parquet(path: Path) -> Iterator[tuple[str, object]]:
    pa = _pyarrow()
    try:
        table = pa.parquet.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path}: not a readable Parquet file ({err})") from None
    yield from _table_rows(table, path)


def _saved_dataset(folder: Path) -> Iterator[tuple[str, object]]:
    """A `save_to_disk` folder: state.json names the Arrow (IPC stream) files, in order."""
    pa = _pyarrow()
    import pyarrow.ipc

    try:
        state = json.loads((folder / "state.json").read_text())
        files = [folder / f["filename"] for f in state["_data_files"]]
    except (ValueError, KeyError, TypeError) as err:
        raise DataError(f"{folder}/state.json: not a datasets save_to_disk state ({err})") from None
    row = 0
    for file in files:
        try:
            with pa.memory_map(str(file)) as source:
                table = pyarrow.ipc.open_stream(source).read_all()
        except (pa.ArrowException, OSError) as err:
            raise DataError(f"{file}: not a readable Arrow stream ({err})") from None
        for record in table.to_pylist():
            row += 1
            yield f"{folder}:{row}", record


def iter_records(path: str | Path) -> Iterator[tuple[str, object]]:
    """(where, record) for every record of `path`; DataError if it cannot be read."""
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
        raise DataError(f"{path}: data file does not exist (make one with `reasonrl data prepare`)")
    if path.suffix == ".parquet":
        yield from _parquet(path)
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
