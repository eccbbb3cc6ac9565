"""SFT records (`reasonrl.sft.records`): both layouts read from JSONL and Parquet, and every bad
record stopped with `file:line: field`."""

from __future__ import annotations

import json

import pytest

from reasonrl.data.readers import write_records
from reasonrl.errors import DataError
from reasonrl.sft.records import load_records

PAIR = {"prompt": "What is 2 + 3?", "completion": "2 + 3 = 5. The answer is 5."}
CHAT = {"messages": [{"role": "user", "content": "What is 347 * 29?"},
                     {"role": "assistant", "content": "<calculator>347 * 29</calculator>"},
                     {"role": "tool", "content": "10063"},
                     {"role": "assistant", "content": "The answer is 10063."}]}


def jsonl(tmp_path, *records) -> str:
    path = tmp_path / "sft.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def test_pairs_and_conversations_are_read_with_where_they_came_from(tmp_path):
    path = jsonl(tmp_path, PAIR, CHAT, {"prompt": [{"role": "user", "content": "hi"}],
                                        "completion": [{"role": "assistant", "content": "hello"}]})
    first, second, third = load_records(path)
    assert (first.prompt, first.completion, first.messages) == (PAIR["prompt"], PAIR["completion"], None)
    assert first.where == f"{path}:1" and second.where == f"{path}:2"
    assert second.messages == CHAT["messages"] and second.prompt is None
    assert third.prompt == [{"role": "user", "content": "hi"}]


def test_parquet_and_renamed_fields(tmp_path):
    write_records([{"conv": CHAT["messages"]}, {"conv": CHAT["messages"][:2]}], tmp_path / "chat.parquet")
    records = load_records(str(tmp_path / "chat.parquet"), {"messages": "conv"})
    assert [r.where for r in records] == [f"{tmp_path / 'chat.parquet'}:1", f"{tmp_path / 'chat.parquet'}:2"]
    assert records[1].messages == CHAT["messages"][:2]


@pytest.mark.parametrize("record, message", [
    ('"just text"', ":2: expected a JSON object, got str"),
    ({"prompt": "q"}, ":2: missing field 'completion' (an SFT record has 'prompt' and 'completion', or "
                      "'messages'); the record has prompt"),
    ({"question": "q", "answer": "a"}, ":2: missing field 'prompt'"),
    ({"prompt": "", "completion": "a"}, ":2: field 'prompt' must be a non-empty string"),
    ({"prompt": "q", "completion": 7}, ":2: field 'completion' must be a non-empty string"),
    ({"prompt": "q", "completion": [{"role": "user", "content": "a"}]},
     ":2: field 'completion[0].role' is 'user'; allowed: assistant, tool"),
    ({"messages": [{"role": "user", "content": "q"}]},
     ":2: field 'messages' has no assistant turn to train on"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": 5}]},
     ":2: field 'messages[1].content' must be a string"),
    ({"messages": [{"role": "robot", "content": "q"}]},
     ":2: field 'messages[0].role' is 'robot'; allowed: system, user, assistant, tool"),
    ({"messages": "hello"}, ":2: field 'messages' must be a non-empty list"),
    ({**PAIR, "tools": "calculator"}, ":2: field 'tools' must be a list of JSON schema objects"),
])
def test_a_bad_record_is_named_by_file_line_and_field(tmp_path, record, message):
    path = jsonl(tmp_path, PAIR, record)
    with pytest.raises(DataError) as err:
        load_records(path)
    assert str(err.value).startswith(path + message)


def test_an_assistant_turn_with_tool_calls_may_have_no_content(tmp_path):
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}
    (record,) = load_records(jsonl(tmp_path, {"messages": [{"role": "user", "content": "q"}, call,
                                                           {"role": "tool", "content": "1"},
                                                           {"role": "assistant", "content": "1"}]}))
    assert record.messages[1] == {"role": "assistant", "content": "", "tool_calls": call["tool_calls"]}


def test_an_empty_file_is_refused(tmp_path):
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(DataError, match="e.jsonl: no SFT records"):
        load_records(str(tmp_path / "e.jsonl"))
