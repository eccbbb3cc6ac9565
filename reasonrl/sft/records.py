"""SFT records read from files, `datasets` folders or Hub ids, each checked as it is read.

Two layouts, as TRL's SFTTrainer and prime-rl's SFT trainer take them:

- a pair: `prompt` (a string, or a list of messages) and `completion` (a string, or a list of
  assistant messages); the loss is on the completion (TRL's `completion_only_loss`);
- a conversation: `messages`, a list of {"role", "content"} messages (extra keys such as
  `tool_calls`, `name` or `tool_call_id` go to the chat template as they are); the loss is on
  the assistant turns only (TRL's `assistant_only_loss`), the system, user and tool turns are
  context;

with an optional `tools` list (JSON schemas, for the chat template's `tools=`). The readers are
the data package's (`reasonrl.data.readers.iter_records`: JSONL and JSON read here so a bad
record is named by `file:line`; Parquet, CSV, Arrow, `save_to_disk` folders and Hub ids through
`datasets`), and a bad record stops the run before any model loads with `file:line: field ...`,
as a bad RL record does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reasonrl.data.files import _get  # dotted field paths, nulls not found: the RL records' rule
from reasonrl.data.readers import is_hub_id, iter_records
from reasonrl.errors import DataError

ROLES = ("system", "user", "assistant", "tool")


@dataclass
class SFTRecord:
    """One training (or held-out) record: a prompt and its completion, or a conversation."""

    where: str  # file:line (or dataset:row) it came from
    prompt: str | list[dict] | None = None  # a pair's prompt: text, or messages
    completion: str | list[dict] | None = None  # a pair's completion: text, or assistant messages
    messages: list[dict] | None = None  # a conversation
    tools: list[dict] | None = None  # JSON schemas for the chat template
    meta: dict = field(default_factory=dict)


def check_messages(value: object, where: str, key: str, roles: tuple[str, ...] = ROLES) -> list[dict]:
    """`value` as a list of messages, each a dict with a `role` among `roles` and a string
    `content` (an assistant message with `tool_calls` may have an empty or null content); a
    DataError naming the record, the field and the message otherwise."""
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: field '{key}' must be a non-empty list of "
                        '{"role": str, "content": str} objects')
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise DataError(f"{where}: field '{key}[{i}]' must be an object with a string 'role'")
        if m["role"] not in roles:
            raise DataError(f"{where}: field '{key}[{i}].role' is {m['role']!r}; allowed: {', '.join(roles)}")
        content = m.get("content")
        if content is None and m.get("tool_calls"):
            content = ""
        if not isinstance(content, str):
            raise DataError(f"{where}: field '{key}[{i}].content' must be a string")
        out.append({k: v for k, v in {**m, "content": content}.items() if v is not None})
    return out


def to_record(raw: object, where: str, fields: dict[str, str]) -> SFTRecord:
    """One raw record as an `SFTRecord` (module docstring), or a DataError naming `where`,
    the field and, for a record of neither layout, the fields it has."""
    if not isinstance(raw, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(raw).__name__}")

    def get(name: str) -> tuple[bool, object, str]:
        key = fields.get(name, name)
        found, value = _get(raw, key)
        return found, value, key

    has_messages, messages, messages_key = get("messages")
    has_prompt, prompt, prompt_key = get("prompt")
    has_completion, completion, completion_key = get("completion")
    has_tools, tools, tools_key = get("tools")
    if has_tools and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise DataError(f"{where}: field '{tools_key}' must be a list of JSON schema objects")
    tools = tools if has_tools and tools else None
    if has_messages:
        messages = check_messages(messages, where, messages_key)
        if not any(m["role"] == "assistant" for m in messages):
            raise DataError(f"{where}: field '{messages_key}' has no assistant turn to train on")
        return SFTRecord(where, messages=messages, tools=tools)
    if not has_prompt or not has_completion:
        missing = completion_key if has_prompt else prompt_key
        has = ", ".join(sorted(raw)) or "no fields"
        raise DataError(f"{where}: missing field '{missing}' (an SFT record has '{prompt_key}' and "
                        f"'{completion_key}', or '{messages_key}'); the record has {has}")
    if isinstance(prompt, list):
        prompt = check_messages(prompt, where, prompt_key, ("system", "user", "assistant", "tool"))
    elif not isinstance(prompt, str) or not prompt.strip():
        raise DataError(f"{where}: field '{prompt_key}' must be a non-empty string (or a list of messages)")
    if isinstance(completion, list):
        completion = check_messages(completion, where, completion_key, ("assistant", "tool"))
        if not any(m["role"] == "assistant" for m in completion):
            raise DataError(f"{where}: field '{completion_key}' has no assistant message to train on")
    elif not isinstance(completion, str) or not completion.strip():
        raise DataError(f"{where}: field '{completion_key}' must be a non-empty string (or a list of "
                        "assistant messages)")
    return SFTRecord(where, prompt=prompt, completion=completion, tools=tools)


def load_records(paths: str, fields: dict[str, str] | None = None, subset: str = "",
                 split: str = "train") -> list[SFTRecord]:
    """The records of a comma-separated list of files, folders or Hub dataset ids, in order
    (`reasonrl.data.readers.iter_records`); a DataError for the first bad one, or for a source
    with none."""
    records: list[SFTRecord] = []
    for path in (p.strip() for p in paths.split(",")):
        if not path:
            continue
        found = [to_record(raw, where, fields or {}) for where, raw in iter_records(path, subset, split)]
        if not found:
            where = f"{path}[{subset + '/' if subset else ''}{split}]" if is_hub_id(path) else path
            raise DataError(f"{where}: no SFT records (empty)")
        records += found
    return records
