"""SFT records as token rows (`reasonrl.sft.rows`), through SmolLM2's real tokenizer and chat
template: the prompt is `train`'s prompt, the trained tokens are the completion and the
assistant turns up to their stop token, tool and user turns are context."""

from __future__ import annotations

import copy

import pytest

from reasonrl.batch import Example
from reasonrl.data import render_prompt
from reasonrl.errors import DataError
from reasonrl.sft.records import SFTRecord
from reasonrl.sft.rows import RowSettings, stop_token_ids, to_row, to_rows

EOS = 2  # SmolLM2's <|im_end|>: the generation config's eos_token_id
SETTINGS = RowSettings(stop_ids=(EOS,))


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def trained_spans(tokenizer, row) -> list[str]:
    """The decoded runs of consecutive trained tokens."""
    spans, run = [], []
    for token, m in zip(row.completion_ids, row.token_mask, strict=True):
        if m:
            run.append(token)
        elif run:
            spans, run = [*spans, run], []
    return [tokenizer.decode(s) for s in [*spans, *([run] if run else [])]]


def test_the_stop_tokens_are_the_engines(tiny):
    model, tokenizer = tiny
    assert stop_token_ids(model, tokenizer) == (EOS,)


def test_a_pair_is_trains_prompt_then_the_completion_up_to_its_stop_token(tiny):
    _, tok = tiny
    settings = RowSettings(system_prompt="Be brief.", stop_ids=(EOS,))
    row = to_row(SFTRecord("f:1", prompt="What is 2 + 3?", completion="The answer is 5."), tok, settings)
    # the prompt `train` feeds the engine for this question and system prompt, token for token
    assert row.prompt_ids == ids(tok, render_prompt(Example("What is 2 + 3?", "5"), tok, True, "Be brief."))
    # then the completion, its <|im_end|> (trained) and the template's newline after it (context)
    assert row.completion_ids == ids(tok, "The answer is 5.") + [EOS] + ids(tok, "\n")
    assert row.token_mask == [1] * (len(ids(tok, "The answer is 5.")) + 1) + [0]
    assert trained_spans(tok, row) == ["The answer is 5.<|im_end|>"]


def test_a_conversation_trains_its_assistant_turns_only(tiny):
    _, tok = tiny
    messages = [{"role": "user", "content": "What is 347 * 29?"},
                {"role": "assistant", "content": "<calculator>347 * 29</calculator>"},
                {"role": "tool", "content": "10063"},
                {"role": "assistant", "content": "The answer is 10063."}]
    row = to_row(SFTRecord("f:1", messages=messages), tok, SETTINGS)
    assert trained_spans(tok, row) == ["<calculator>347 * 29</calculator><|im_end|>",
                                       "The answer is 10063.<|im_end|>"]
    # every token is there once, in order: the whole conversation as the template renders it
    whole = tok.apply_chat_template(messages, tokenize=False)
    assert tok.decode(row.prompt_ids + row.completion_ids) == whole
    assert tok.decode(row.prompt_ids).endswith("<|im_start|>assistant\n")  # up to the first trained token


def test_completion_only_off_trains_every_token_after_the_first(tiny):
    _, tok = tiny
    row = to_row(SFTRecord("f:1", prompt="hi", completion="hello"), tok,
                 RowSettings(completion_only=False, stop_ids=(EOS,)))
    assert len(row.prompt_ids) == 1 and all(row.token_mask)


def test_text_without_the_chat_template_is_verbatim_with_the_stop_token_appended(tiny):
    _, tok = tiny
    row = to_row(SFTRecord("f:1", prompt="Q: 2 + 3\nA:", completion=" 5"), tok,
                 RowSettings(apply_chat_template=False, stop_ids=(EOS,)))
    assert row.prompt_ids == ids(tok, "Q: 2 + 3\nA:")
    assert row.completion_ids == ids(tok, " 5") + [EOS] and row.token_mask == [1] * (len(ids(tok, " 5")) + 1)


def test_records_longer_than_max_tokens_are_listed_or_cut(tiny):
    _, tok = tiny
    long = SFTRecord("f:2", prompt="hi", completion="word " * 50)
    records = [SFTRecord("f:1", prompt="hi", completion="ok"), long]
    with pytest.raises(DataError) as err:
        to_rows(records, tok, RowSettings(max_tokens=40, stop_ids=(EOS,)))
    tokens = to_row(long, tok, RowSettings(stop_ids=(EOS,))).tokens
    assert str(err.value).startswith(f"1 records longer than sft.max_tokens=40: f:2 ({tokens} tokens). ")
    rows = to_rows(records, tok, RowSettings(max_tokens=40, truncate="right", stop_ids=(EOS,)))
    assert rows[1].tokens == 40 and all(rows[1].token_mask)  # its start kept, the completion's tail cut
    with pytest.raises(DataError, match="f:2: nothing to train on: its first 5 tokens"):
        to_row(long, tok, RowSettings(max_tokens=5, truncate="right", stop_ids=(EOS,)))


def test_a_template_that_rewrites_earlier_turns_is_refused_by_name(tiny):
    _, tok = tiny
    tok = copy.deepcopy(tok)
    # the last assistant turn rendered in full, earlier ones as "..." (as templates that drop reasoning)
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' "
                         "and not loop.last %}...{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    with pytest.raises(DataError, match=r"^f:7: field 'messages': the model's chat template renders turn 2 "
                                        r"\(user\) by changing the text of the turns before it"):
        to_row(SFTRecord("f:7", messages=messages), tok, SETTINGS)


def test_a_conversation_opening_with_the_assistant_is_refused(tiny):
    _, tok = tiny
    with pytest.raises(DataError, match="f:3: field 'messages': the conversation opens with an assistant"):
        to_row(SFTRecord("f:3", messages=[{"role": "assistant", "content": "x"}]), tok, SETTINGS)


def test_the_environments_tools_reach_the_prompt_as_train_renders_them(tiny):
    """SmolLM2's template ignores `tools=`: `train` describes them in the system message, and so
    does SFT, for a record without tools of its own."""
    _, tok = tiny
    tools = ({"type": "function", "function": {"name": "calculator", "description": "arithmetic",
                                                "parameters": {"type": "object", "properties": {}}}},)
    settings = RowSettings(system_prompt="Be brief.", stop_ids=(EOS,), tools=tools)
    row = to_row(SFTRecord("f:1", prompt="What is 2 + 3?", completion="5"), tok, settings)
    expected = render_prompt(Example("What is 2 + 3?", "5"), tok, True, "Be brief.", list(tools))
    assert "<tools>" in expected and row.prompt_ids == ids(tok, expected)
