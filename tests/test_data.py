"""Tests for reasonrl.data: JSONL loading and its errors, the arithmetic generator,
prompt rendering, and the resumable prompt sampler."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from reasonrl.batch import Example
from reasonrl.config import ArithmeticConfig, DataConfig
from reasonrl.data import (
    DataError,
    PromptSampler,
    _evaluate,
    arithmetic_examples,
    arithmetic_problem,
    load_examples,
    load_jsonl,
    render_prompt,
)

FIXTURE = Path(__file__).parent / "fixtures" / "tiny_math.jsonl"
ASSISTANT_HEADER = "<|im_start|>assistant\n"


def write_lines(tmp_path: Path, lines: list[str], name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------------------ JSONL


def test_load_jsonl_fixture():
    examples = load_jsonl(FIXTURE)
    assert len(examples) == 4  # the blank line 3 is skipped

    first, second, third, fourth = examples
    assert first.prompt == "What is 2 + 3?"
    assert first.ground_truth == "5"
    assert first.data_source == "tiny_math"  # default: the file's stem
    assert first.meta == {"origin": f"{FIXTURE}:1"}

    assert second.ground_truth == "42"  # numbers become strings
    assert second.data_source == "mult"
    assert second.meta == {"level": 1, "origin": f"{FIXTURE}:2"}

    assert third.prompt == [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "What is 1.5 + 1?"}]
    assert third.ground_truth == "2.5"
    assert third.meta == {"split": "train", "origin": f"{FIXTURE}:4"}  # extra_info = meta
    assert fourth.prompt == [{"role": "user", "content": "What is 10 - 4?"}]
    assert fourth.meta["origin"] == f"{FIXTURE}:5"


def test_load_jsonl_explicit_data_source(tmp_path):
    path = write_lines(tmp_path, [
        '{"prompt": "q1", "ground_truth": "1"}',
        '{"prompt": "q2", "ground_truth": "2", "data_source": "own"}',
    ])
    a, b = load_jsonl(path, data_source="gsm8k")
    assert a.data_source == "gsm8k"
    assert b.data_source == "own"  # a record's own data_source wins


def test_load_jsonl_meta_preferred_over_extra_info(tmp_path):
    path = write_lines(tmp_path, ['{"prompt": "q", "ground_truth": "1", '
                                  '"meta": {"a": 1}, "extra_info": {"b": 2}}'])
    (ex,) = load_jsonl(path)
    assert ex.meta == {"a": 1, "origin": f"{path}:1"}


def test_load_jsonl_accepts_str_path_and_negative_float_truth(tmp_path):
    path = write_lines(tmp_path, ['{"prompt": "q", "ground_truth": -0.5}'])
    (ex,) = load_jsonl(str(path))
    assert ex.ground_truth == "-0.5"
    assert isinstance(ex, Example)


@pytest.mark.parametrize("lines, lineno, needle", [
    (['{"prompt": "q", "ground_truth": "1"}', '{"prompt": "q", "ground_truth": '],
     2, "not valid JSON"),
    (['["prompt", "ground_truth"]'], 1, "expected a JSON object, got list"),
    (['{"question": "q", "ground_truth": "1"}'], 1, "missing field 'prompt'"),
    (['{"prompt": "   ", "ground_truth": "1"}'], 1, "field 'prompt'"),
    (['{"prompt": 7, "ground_truth": "1"}'], 1, "field 'prompt'"),
    (['{"messages": [], "ground_truth": "1"}'], 1, "field 'messages'"),
    (['{"messages": "hi", "ground_truth": "1"}'], 1, "field 'messages'"),
    (['{"messages": [{"role": "user"}], "ground_truth": "1"}'], 1, "field 'messages'"),
    (['{"messages": [{"role": "user", "content": 3}], "ground_truth": "1"}'], 1, "field 'messages'"),
    (['{"prompt": "q", "ground_truth": "1"}', "", '{"prompt": "q"}'], 3,
     "missing field 'ground_truth'"),
    (['{"prompt": "q", "ground_truth": true}'], 1, "field 'ground_truth'"),
    (['{"prompt": "q", "ground_truth": ""}'], 1, "field 'ground_truth'"),
    (['{"prompt": "q", "ground_truth": null}'], 1, "field 'ground_truth'"),
    (['{"prompt": "q", "ground_truth": [1]}'], 1, "field 'ground_truth'"),
    (['{"prompt": "q", "ground_truth": "1", "meta": [1]}'], 1, "field 'meta'"),
    (['{"prompt": "q", "ground_truth": "1", "data_source": 5}'], 1, "field 'data_source'"),
])
def test_load_jsonl_errors_name_file_line_and_field(tmp_path, lines, lineno, needle):
    path = write_lines(tmp_path, lines)
    with pytest.raises(DataError) as info:
        load_jsonl(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:{lineno}: ")
    assert needle in msg


def test_load_jsonl_missing_file(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(DataError, match="does not exist") as info:
        load_jsonl(path)
    assert str(info.value).startswith(str(path))


@pytest.mark.parametrize("text", ["", "\n  \n\n"])
def test_load_jsonl_empty_file(tmp_path, text):
    path = tmp_path / "empty.jsonl"
    path.write_text(text)
    with pytest.raises(DataError, match="no examples") as info:
        load_jsonl(path)
    assert str(info.value).startswith(str(path))


def test_load_examples_jsonl(tmp_path):
    val = write_lines(tmp_path, [json.dumps({"prompt": f"v{i}", "ground_truth": i}) for i in range(5)],
                      name="val.jsonl")
    cfg = DataConfig(task="jsonl", train_path=str(FIXTURE), val_path=str(val), val_size=3)
    train, held_out = load_examples(cfg, seed=0)
    assert [e.ground_truth for e in train] == ["5", "42", "2.5", "6"]
    assert [e.prompt for e in held_out] == ["v0", "v1", "v2"]
    assert load_examples(DataConfig(task="jsonl", train_path=str(FIXTURE)), seed=0)[1] == []


# ------------------------------------------------------------------------- arithmetic


def safe_eval(expression: str) -> int:
    """Evaluate `a op b op c ...` (non-negative int operands, + - *) with `*` binding tighter."""
    tokens = expression.split()
    assert len(tokens) % 2 == 1
    total, product, sign = 0, int(tokens[0]), 1
    for op, operand in zip(tokens[1::2], tokens[2::2], strict=True):
        assert op in "+-*" and operand.isdigit()
        if op == "*":
            product *= int(operand)
        else:
            total += sign * product
            product, sign = int(operand), (1 if op == "+" else -1)
    return total + sign * product


def test_safe_eval_itself():
    assert safe_eval("2 + 3 * 4") == 14
    assert safe_eval("2 * 3 - 4 * 5 + 1") == -13
    assert safe_eval("9") == 9


@pytest.mark.parametrize("operands, ops, value", [
    ([2, 3, 4], ["+", "*"], 14),
    ([2, 3, 4], ["*", "+"], 10),
    ([2, 3, 4], ["-", "*"], -10),
    ([2, 3, 4], ["*", "-"], 2),
    ([10, 3, 2], ["-", "-"], 5),
    ([1, 2, 3, 4], ["*", "*", "+"], 10),
    ([5, 0], ["*"], 0),
    ([7, 5], ["+"], 12),
])
def test_evaluate_precedence(operands, ops, value):
    assert _evaluate(operands, ops) == value


def test_arithmetic_problem_format():
    cfg = ArithmeticConfig(min_operand=3, max_operand=3, operators=["*"], num_operands=3)
    assert arithmetic_problem(random.Random(0), cfg) == ("3 * 3 * 3", 27)


MIXED = ArithmeticConfig(min_operand=0, max_operand=12, operators=["+", "-", "*"], num_operands=3,
                         train_size=300, val_size=40)


def test_arithmetic_deterministic_per_seed():
    train_a, val_a = arithmetic_examples(MIXED, seed=3)
    train_b, val_b = arithmetic_examples(MIXED, seed=3)
    assert train_a == train_b and val_a == val_b
    train_c, val_c = arithmetic_examples(MIXED, seed=4)
    assert [e.prompt for e in train_c] != [e.prompt for e in train_a]
    assert [e.prompt for e in val_c] != [e.prompt for e in val_a]


def test_arithmetic_sizes_disjoint_and_correct():
    train, held_out = arithmetic_examples(MIXED, seed=0)
    assert (len(train), len(held_out)) == (300, 40)
    train_exprs = {e.meta["expression"] for e in train}
    held_exprs = [e.meta["expression"] for e in held_out]
    assert len(set(held_exprs)) == 40  # held-out problems are distinct
    assert train_exprs.isdisjoint(held_exprs)
    ops_seen = set()
    for ex in train + held_out:
        expr = ex.meta["expression"]
        tokens = expr.split()
        assert len(tokens) == 5
        assert all(0 <= int(t) <= 12 for t in tokens[::2])
        ops_seen.update(tokens[1::2])
        assert ex.prompt == f"What is {expr}?"
        assert ex.ground_truth == str(safe_eval(expr))
        assert ex.data_source == "arithmetic"
    assert ops_seen == {"+", "-", "*"}


def test_arithmetic_held_out_capped_to_a_third_of_small_space(capsys):
    cfg = ArithmeticConfig(min_operand=0, max_operand=2, operators=["+"], num_operands=2,
                           train_size=30, val_size=50)  # 3 * 3 = 9 distinct problems
    train, held_out = arithmetic_examples(cfg, seed=0)
    assert len(held_out) == 3
    assert len(train) == 30
    held = {e.meta["expression"] for e in held_out}
    assert {e.meta["expression"] for e in train} == {
        f"{a} + {b}" for a in range(3) for b in range(3)} - held  # all the rest, only the rest
    assert "only 9 distinct problems; holding out 3 instead of val_size=50" in capsys.readouterr().out


def test_load_examples_arithmetic_val_size():
    cfg = DataConfig(val_size=5, arithmetic=ArithmeticConfig(train_size=20, val_size=10))
    train, held_out = load_examples(cfg, seed=1)
    full_train, full_held_out = arithmetic_examples(cfg.arithmetic, seed=1)
    assert train == full_train
    assert held_out == full_held_out[:5]


# ------------------------------------------------------------------------------ prompts


def test_render_plain_prompt_with_template(tokenizer):
    ex = Example(prompt="What is 2 + 3?", ground_truth="5")
    text = render_prompt(ex, tokenizer, apply_chat_template=True, system_prompt="Be a calculator.")
    assert text == ("<|im_start|>system\nBe a calculator.<|im_end|>\n"
                    "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n" + ASSISTANT_HEADER)


def test_render_plain_prompt_verbatim(tokenizer):
    raw = "<|im_start|>user\nalready templated<|im_end|>\n<|im_start|>assistant\n"
    ex = Example(prompt=raw, ground_truth="5")
    assert render_prompt(ex, tokenizer, apply_chat_template=False, system_prompt="ignored") == raw


def test_render_messages_keep_their_own_system(tokenizer):
    ex = Example(prompt=[{"role": "system", "content": "Own system."},
                         {"role": "user", "content": "Q?"}], ground_truth="1")
    for apply in (True, False):  # messages are always templated
        text = render_prompt(ex, tokenizer, apply_chat_template=apply, system_prompt="Config system.")
        assert text.count("<|im_start|>system") == 1
        assert "Own system." in text and "Config system." not in text
        assert text.endswith(ASSISTANT_HEADER)


def test_render_messages_get_config_system(tokenizer):
    ex = Example(prompt=[{"role": "user", "content": "Q?"}], ground_truth="1")
    text = render_prompt(ex, tokenizer, apply_chat_template=True, system_prompt="Config system.")
    assert text.startswith("<|im_start|>system\nConfig system.<|im_end|>\n<|im_start|>user\nQ?")
    assert text.count("<|im_start|>system") == 1


# ------------------------------------------------------------------------------ sampler


def numbered(count: int) -> list[Example]:
    return [Example(prompt=f"q{i}", ground_truth=str(i)) for i in range(count)]


def ids(batch: list[Example]) -> list[int]:
    return [int(e.ground_truth) for e in batch]


def test_sampler_deterministic_for_seed():
    data = numbered(10)
    assert ids(PromptSampler(data, seed=5).next(25)) == ids(PromptSampler(data, seed=5).next(25))
    assert ids(PromptSampler(data, seed=5).next(10)) != ids(PromptSampler(data, seed=6).next(10))


def test_sampler_covers_every_example_once_per_epoch():
    sampler = PromptSampler(numbered(7), seed=0)
    epochs = [ids(sampler.next(7)) for _ in range(3)]
    for order in epochs:
        assert sorted(order) == list(range(7))
    assert epochs[0] != epochs[1]  # each epoch is reshuffled
    assert sampler.state_dict() == {"epoch": 2, "position": 7}


def test_sampler_batches_straddle_epochs():
    sampler = PromptSampler(numbered(5), seed=2)
    first, second = ids(sampler.next(3)), ids(sampler.next(4))
    assert sorted(first + second[:2]) == list(range(5))
    assert sampler.state_dict() == {"epoch": 1, "position": 2}


def test_sampler_without_shuffle_is_in_order():
    assert ids(PromptSampler(numbered(4), seed=9, shuffle=False).next(6)) == [0, 1, 2, 3, 0, 1]


@pytest.mark.parametrize("warmup", [0, 3, 7, 12])
def test_sampler_resume_gives_the_same_stream(warmup):
    data = numbered(7)
    original = PromptSampler(data, seed=11)
    original.next(warmup)
    state = original.state_dict()
    expected = ids(original.next(10))

    resumed = PromptSampler(data, seed=11)
    resumed.load_state_dict(dict(state))
    assert ids(resumed.next(10)) == expected
