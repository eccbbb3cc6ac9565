"""Examples from files: one `Example` per record of a JSONL / JSON / Parquet file or a
`datasets` folder, with every malformed record reported as file:line and field."""

from __future__ import annotations

import json
from pathlib import Path

from reasonrl.batch import Example
from reasonrl.data import formats  # noqa: F401  (fills DATA_FORMATS)
from reasonrl.data.readers import is_hub_id, iter_records
from reasonrl.errors import DataError
from reasonrl.registry import DATA_FORMATS


def _get(record: dict, dotted: str) -> tuple[bool, object]:
    """(found, value) of a dotted field path like `reward_model.ground_truth`. A null is not
    found: Parquet fills a column that some records lack with nulls."""
    node: object = record
    for part in dotted.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            return False, None
        node = node[part]
    return True, node


def load_file(path: str | Path, data_source: str | None = None, fields: dict[str, str] | None = None,
              subset: str = "", split: str = "train", fmt: str = "") -> list[Example]:
    """Read one `Example` per record of a JSONL / JSON / Parquet / CSV file, a `datasets` folder,
    or a Hub dataset (`subset`, `split`; `reasonrl.data.readers`).

    A record has `prompt` (a string, or a list of {"role", "content"} messages as in verl's
    Parquet files) or `messages` (a list of messages), `ground_truth` (string, number, or an
    object, kept as JSON text; verl's `reward_model.ground_truth` is found too), and optional
    `data_source` (default: `data_source` or the file's stem / the dataset's id) and
    `extra_info` (or `meta`). `fields` renames them: {"prompt": "question", "ground_truth":
    "reward_model.ground_truth"}. `fmt` maps a known layout first (`data.format`: gsm8k, math,
    numina, countdown; `reasonrl.data.formats`). Anything malformed raises `DataError` naming the
    record (file:line, dataset:row), the field, and the fields the record has.
    """
    source = data_source or (str(path) if is_hub_id(str(path)) else Path(path).stem)
    convert = DATA_FORMATS.get(fmt) if fmt else None
    examples = []
    for index, (where, record) in enumerate(iter_records(str(path), subset, split)):
        if convert is not None:
            record = convert(record, where, index)
        examples.append(_record_to_example(record, where, source, fields or {}))
    if not examples:
        where = f"{path}[{subset + '/' if subset else ''}{split}]" if is_hub_id(str(path)) else str(path)
        raise DataError(f"{where}: no examples (the {'split' if where != str(path) else 'file'} is empty)")
    return examples


def load_jsonl(path: str | Path, data_source: str | None = None) -> list[Example]:
    """`load_file` for a JSONL file (kept for its callers; any supported format works)."""
    return load_file(path, data_source)


def load_files(paths: str, fields: dict[str, str] | None = None, subset: str = "", split: str = "train",
               fmt: str = "") -> list[Example]:
    """`load_file` over a comma-separated list of paths, concatenated in order."""
    examples = []
    for path in (p.strip() for p in paths.split(",")):
        if path:
            examples += load_file(path, fields=fields, subset=subset, split=split, fmt=fmt)
    return examples


def _record_to_example(record: object, where: str, source: str, fields: dict[str, str]) -> Example:
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")

    def field(name: str) -> tuple[bool, object, str]:
        key = fields.get(name, name)
        found, value = _get(record, key)
        return found, value, key

    has_prompt, prompt, prompt_key = field("prompt")
    has_messages, messages, messages_key = field("messages")
    if has_prompt and isinstance(prompt, list) or not has_prompt and has_messages:
        key = prompt_key if has_prompt else messages_key
        prompt = prompt if has_prompt else messages
        ok = isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in prompt)
        if not ok:
            raise DataError(f"{where}: field '{key}' must be a non-empty list of "
                            '{"role": str, "content": str} objects')
        prompt = [{"role": m["role"], "content": m["content"]} for m in prompt]
    elif has_prompt:
        if not isinstance(prompt, str) or not prompt.strip():
            raise DataError(f"{where}: field '{prompt_key}' must be a non-empty string "
                            "(or a list of messages)")
    else:
        raise DataError(f"{where}: missing field '{prompt_key}' (or '{messages_key}')")
    found, truth, truth_key = field("ground_truth")
    if not found and "ground_truth" not in fields:
        found, truth = _get(record, "reward_model.ground_truth")  # verl's layout
    if not found:
        raise DataError(f"{where}: missing field '{truth_key}'")
    if isinstance(truth, dict):
        truth = json.dumps(truth, sort_keys=True)
    if isinstance(truth, bool) or not isinstance(truth, (str, int, float)) or str(truth) == "":
        raise DataError(f"{where}: field '{truth_key}' must be a non-empty string, number or object")
    meta_key = fields.get("extra_info", "meta" if "meta" in record else "extra_info")
    meta = _get(record, meta_key)[1]
    meta = {} if meta is None else meta
    if not isinstance(meta, dict):
        raise DataError(f"{where}: field '{meta_key}' must be an object")
    found, data_source, source_key = field("data_source")
    data_source = data_source if found else source
    if not isinstance(data_source, str):
        raise DataError(f"{where}: field '{source_key}' must be a string")
    return Example(prompt=prompt, ground_truth=str(truth), data_source=data_source,
                   meta={**meta, "origin": where})
