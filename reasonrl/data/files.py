"""Examples from files: one `Example` per record of a JSONL / JSON / Parquet file or a
`datasets` folder, with every malformed record reported as file:line and field.

A prompt longer in bytes than `data.max_prompt_tokens` tokens can be (`prompt_byte_limit`) is
refused here, before any tokenizer sees it: tokenising a 50 MB prompt only to find it too long
took more than 5 GB of memory. A token covers at most `BYTES_PER_TOKEN` bytes of text, so a
prompt of more than max_prompt_tokens x that many bytes has more tokens than allowed, whatever
the tokenizer, chat template or system prompt; shorter ones are counted by the tokenizer at
start-up as before (`rollout.worker.check_prompt_lengths`).
"""

from __future__ import annotations

import json
from pathlib import Path

from reasonrl.batch import Example
from reasonrl.data.formats import format_hint, format_mismatch  # (and fills DATA_FORMATS)
from reasonrl.data.readers import is_hub_id, iter_records
from reasonrl.errors import DataError
from reasonrl.registry import DATA_FORMATS

# The most bytes of text one token stands for, a ceiling over real tokenizers: the longest token
# of SmolLM2's (the default model's) is 81 bytes (a newline and 80 spaces); byte-level BPE
# vocabularies' longest are runs of spaces or punctuation of that order.
BYTES_PER_TOKEN = 128


def prompt_byte_limit(max_prompt_tokens: int) -> int:
    """The most bytes a prompt of at most `max_prompt_tokens` tokens can have."""
    return max_prompt_tokens * BYTES_PER_TOKEN


def _text_bytes(prompt: str | list[dict]) -> int:
    """The UTF-8 size of a prompt's text (a chat's: its messages' contents)."""
    texts = [prompt] if isinstance(prompt, str) else [m["content"] for m in prompt]
    return sum(len(t) if t.isascii() else len(t.encode("utf-8", "surrogatepass")) for t in texts)


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
              subset: str = "", split: str = "train", fmt: str = "",
              max_prompt_tokens: int = 0) -> list[Example]:
    """Read one `Example` per record of a JSONL / JSON / Parquet / CSV file, a `datasets` folder,
    or a Hub dataset (`subset`, `split`; `reasonrl.data.readers`).

    A record has `prompt` (a string, or a list of {"role", "content"} messages as in verl's
    Parquet files) or `messages` (a list of messages), `ground_truth` (string, number, or an
    object, kept as JSON text; verl's `reward_model.ground_truth` is found too), and optional
    `data_source` (default: `data_source` or the file's stem / the dataset's id) and
    `extra_info` (or `meta`). `fields` renames them: {"prompt": "question", "ground_truth":
    "reward_model.ground_truth"}. `fmt` maps a known layout first (`data.format`: gsm8k, math,
    numina, countdown; `reasonrl.data.formats`). Anything malformed raises `DataError` naming the
    record (file:line, dataset:row), the field, and the fields the record has; so does, with
    `max_prompt_tokens` > 0, a prompt longer than `prompt_byte_limit(max_prompt_tokens)` bytes.
    """
    source = data_source or (str(path) if is_hub_id(str(path)) else Path(path).stem)
    convert = DATA_FORMATS.get(fmt) if fmt else None
    examples = []
    for index, (where, record) in enumerate(iter_records(str(path), subset, split)):
        if convert is not None:
            if (problem := format_mismatch(record, where, fmt)) is not None:
                raise DataError(problem)
            record = convert(record, where, index)
        examples.append(_record_to_example(record, where, source, fields or {}, max_prompt_tokens))
    if not examples:
        where = f"{path}[{subset + '/' if subset else ''}{split}]" if is_hub_id(str(path)) else str(path)
        raise DataError(f"{where}: no examples (the {'split' if where != str(path) else 'file'} is empty)")
    return examples


def load_jsonl(path: str | Path, data_source: str | None = None) -> list[Example]:
    """`load_file` for a JSONL file (kept for its callers; any supported format works)."""
    return load_file(path, data_source)


def load_files(paths: str, fields: dict[str, str] | None = None, subset: str = "", split: str = "train",
               fmt: str = "", max_prompt_tokens: int = 0) -> list[Example]:
    """`load_file` over a comma-separated list of paths, concatenated in order."""
    examples = []
    for path in (p.strip() for p in paths.split(",")):
        if path:
            examples += load_file(path, fields=fields, subset=subset, split=split, fmt=fmt,
                                  max_prompt_tokens=max_prompt_tokens)
    return examples


def _record_to_example(record: object, where: str, source: str, fields: dict[str, str],
                       max_prompt_tokens: int = 0) -> Example:
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
        has = ", ".join(sorted(record)) or "no fields"
        hint = "" if fields else f"; the record has {has}; {format_hint(record)}"  # renamed: no guess
        raise DataError(f"{where}: missing field '{prompt_key}' (or '{messages_key}'){hint}")
    if max_prompt_tokens and (size := _text_bytes(prompt)) > (limit := prompt_byte_limit(max_prompt_tokens)):
        key = prompt_key if has_prompt else messages_key
        raise DataError(f"{where}: field '{key}' is {size:,} bytes, more than data.max_prompt_tokens="
                        f"{max_prompt_tokens} tokens can hold (at most {limit:,} bytes: {BYTES_PER_TOKEN} "
                        f"bytes per token at most); refused before it is tokenised. Shorten or drop the "
                        f"record, or raise data.max_prompt_tokens")
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
