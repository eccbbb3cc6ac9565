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
    arithmetic_examples,
    arithmetic_problem,
    load_examples,
    load_file,
    load_jsonl,
    render_prompt,
    take_per_source,
)
from reasonrl.data.arithmetic import _evaluate

FIXTURE = Path(__file__).parents[1] / "fixtures" / "tiny_math.jsonl"
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
    (['{"prompt": [{"role": "user"}], "ground_truth": "1"}'], 1, "field 'prompt' must be a non-empty list"),
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


# ------------------------------------------------------------- formats and field names

FIXTURES = Path(__file__).parents[1] / "fixtures"
RECORDS = [
    {"prompt": [{"role": "user", "content": "What is 2 + 3?"}], "ground_truth": "5", "data_source": "arith",
     "extra_info": {"i": 0}},
    {"prompt": [{"role": "user", "content": "Reach 24 with 3 5 7 9"}],
     "reward_model": {"ground_truth": {"numbers": [3, 5, 7, 9], "target": 24}, "style": "rule"},
     "data_source": "countdown", "extra_info": {"i": 1}},
]


def test_parquet_and_jsonl_give_the_same_examples(tmp_path):
    from reasonrl.data.readers import write_records

    write_records(RECORDS, tmp_path / "d.parquet")
    write_records(RECORDS, tmp_path / "d.jsonl")
    from_parquet = load_file(tmp_path / "d.parquet")
    from_jsonl = load_file(tmp_path / "d.jsonl")
    assert [(e.prompt, e.ground_truth, e.data_source) for e in from_parquet] == \
        [(e.prompt, e.ground_truth, e.data_source) for e in from_jsonl]
    first, second = from_parquet
    assert first.meta == {"i": 0, "origin": f"{tmp_path / 'd.parquet'}:1"}
    assert second.prompt == [{"role": "user", "content": "Reach 24 with 3 5 7 9"}]  # verl: prompt = messages
    assert json.loads(second.ground_truth) == {"numbers": [3, 5, 7, 9], "target": 24}  # reward_model.*


def test_datasets_save_to_disk_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"question": f"q{i}", "answer": str(i), "source": "s"} for i in range(5)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    fields = {"prompt": "question", "ground_truth": "answer", "data_source": "source"}
    examples = load_file(tmp_path / "ds", fields=fields)
    assert [(e.prompt, e.ground_truth, e.data_source) for e in examples] == [
        (f"q{i}", str(i), "s") for i in range(5)]
    assert examples[4].meta["origin"] == f"{tmp_path / 'ds'}:5"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match="DatasetDict with splits train; point at one split"):
        load_file(tmp_path / "dd")


def test_field_remapping_with_dotted_paths(tmp_path):
    path = write_lines(tmp_path, [json.dumps({"q": {"text": "Q?"}, "sol": {"final": 7}, "info": {"x": 1}})])
    (ex,) = load_file(path, fields={"prompt": "q.text", "ground_truth": "sol.final", "extra_info": "info"})
    assert (ex.prompt, ex.ground_truth, ex.meta["x"]) == ("Q?", "7", 1)
    with pytest.raises(DataError, match=r":1: missing field 'answer'"):
        load_file(path, fields={"prompt": "q.text", "ground_truth": "answer"})


def test_json_array_file_and_folder_of_json(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"prompt": "p1", "ground_truth": 1},
                                                 {"prompt": "p2", "ground_truth": 2}]))
    assert [e.ground_truth for e in load_file(tmp_path / "a.json")] == ["1", "2"]
    (tmp_path / "a.json").write_text(json.dumps([{"prompt": "p1", "ground_truth": 1}, {"prompt": "p2"}]))
    with pytest.raises(DataError, match=r"a\.json:item 2: missing field 'ground_truth'"):
        load_file(tmp_path / "a.json")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(DataError, match="no \\*.json files"):
        load_file(tmp_path / "empty_dir")


def test_bytes_that_are_not_utf8_name_file_line_and_offset(tmp_path):
    """A Latin-1 'é' (0xe9) on line 3 was a UnicodeDecodeError traceback with no file:line."""
    path = tmp_path / "latin1.jsonl"
    good = b'{"prompt": "q", "ground_truth": "1"}\n'
    bad = '{"prompt": "caf\u00e9?", "ground_truth": "2"}\n'.encode("latin-1")
    path.write_bytes(good + b"\n" + bad + good)
    with pytest.raises(DataError) as info:
        load_file(path)
    column = bad.index(b"\xe9") + 1
    offset = len(good) + 1 + column - 1
    assert str(info.value) == (f"{path}:3: not UTF-8 text (byte 0xe9 at column {column}, byte offset "
                               f"{offset} of the file); data files must be UTF-8: convert it, e.g. "
                               "with `iconv -f <its encoding> -t utf-8`")
    path.write_bytes(good + bad.decode("latin-1").encode("utf-8"))  # the same text as UTF-8 reads
    assert [e.prompt for e in load_file(path)] == ["q", "caf\u00e9?"]


def test_a_json_file_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "a.json"
    path.write_bytes(b'[\n  {"prompt": "p1", "ground_truth": 1},\n'
                     b'  {"prompt": "\xff", "ground_truth": 2}\n]\n')
    with pytest.raises(DataError, match=r"a\.json:3: not UTF-8 text \(byte 0xff at column 15, byte offset 55 "
                                        r"of the file\)"):
        load_file(path)


def test_reasonrl_train_reports_a_file_that_is_not_utf8_in_one_line(tmp_path, capsys):
    from reasonrl.cli import main

    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"prompt": "\x80", "ground_truth": "1"}\n')
    code = main(["train", "model.path=tiny", "data.task=file", f"data.train_path={path}",
                 f"trainer.output_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (f"reasonrl: error: {path}:1: not UTF-8 text (byte 0x80 at column 13, byte offset 12 of "
                   "the file); data files must be UTF-8: convert it, e.g. with `iconv -f <its encoding> "
                   "-t utf-8`\n")


@pytest.mark.parametrize("bad, needle", [
    ("not parquet", "not a readable Parquet file"),
])
def test_broken_parquet_is_a_clear_error(tmp_path, bad, needle):
    (tmp_path / "x.parquet").write_text(bad)
    with pytest.raises(DataError, match=needle):
        load_file(tmp_path / "x.parquet")


def test_parquet_row_errors_name_file_row_and_field(tmp_path):
    from reasonrl.data.readers import write_records

    write_records([{"prompt": "a", "ground_truth": "1"}, {"prompt": "", "ground_truth": "2"}],
                  tmp_path / "x.parquet")
    with pytest.raises(DataError, match=r"x\.parquet:2: field 'prompt'"):
        load_file(tmp_path / "x.parquet")


def test_comma_separated_paths_and_per_source_val_size(tmp_path):
    def lines(name, count):
        return [json.dumps({"prompt": f"{name}{i}", "ground_truth": i}) for i in range(count)]

    a, b = write_lines(tmp_path, lines("a", 6), "a.jsonl"), write_lines(tmp_path, lines("b", 2), "b.jsonl")
    cfg = DataConfig(task="file", train_path=f"{a}, {b}", val_path=f"{a},{b}", val_size=4)
    train, held_out = load_examples(cfg, seed=0)
    assert len(train) == 8
    assert [e.prompt for e in held_out] == ["a0", "b0", "a1", "b1"]  # both sources kept
    assert [e.prompt for e in take_per_source(train, 7)] == ["a0", "b0", "a1", "b1", "a2", "a3", "a4"]
    assert take_per_source(train[:6], 3) == train[:3]


# ------------------------------------------------------------------------ generators


def test_countdown_generator_is_seeded_solvable_and_disjoint():
    from reasonrl.config import CountdownConfig
    from reasonrl.data.countdown import countdown_examples
    from reasonrl.rewards.countdown import evaluate_equation, extract_equation

    cfg = CountdownConfig(train_size=200, val_size=30)
    train, held_out = countdown_examples(cfg, seed=0)
    assert (train, held_out) == countdown_examples(cfg, seed=0)
    assert train != countdown_examples(cfg, seed=1)[0]
    assert (len(train), len(held_out)) == (200, 30)
    keys = lambda xs: {(tuple(sorted(e.meta["numbers"])), e.meta["target"]) for e in xs}  # noqa: E731
    assert keys(train).isdisjoint(keys(held_out))
    for e in train + held_out:
        truth = json.loads(e.ground_truth)
        assert 3 <= len(truth["numbers"]) <= 4 and 1 <= truth["target"] <= 100
        assert all(1 <= n <= 99 for n in truth["numbers"]) and truth["target"] not in truth["numbers"]
        value, used = evaluate_equation(extract_equation(e.meta["solution"]))
        assert value == truth["target"] and sorted(used) == sorted(truth["numbers"])
        assert e.data_source == "countdown" and str(truth["numbers"]) in e.prompt


def test_piecewise_generator():
    from reasonrl.config import PiecewiseConfig
    from reasonrl.data.piecewise import piecewise_examples

    train, held_out = piecewise_examples(PiecewiseConfig(), seed=0)
    assert len(train) == len(held_out) == 1 and train == held_out
    assert "ax+3" in train[0].prompt and "x-5" in train[0].prompt and "\\boxed{}" in train[0].prompt
    assert json.loads(train[0].ground_truth) == {"a": -3, "b": 3, "k": 2}
    train, held_out = piecewise_examples(PiecewiseConfig(train_variants=6, val_variants=4), seed=0)
    assert (len(train), len(held_out)) == (7, 5)
    consts = lambda xs: {(e.meta["k"], e.meta["p"], e.meta["q"]) for e in xs[1:]}  # noqa: E731
    assert consts(train).isdisjoint(consts(held_out)) and len(consts(train)) == 6


def test_load_examples_generators():
    train, held_out = load_examples(DataConfig(task="countdown", val_size=5), seed=0)
    assert len(train) == 2000 and len(held_out) == 5
    train, held_out = load_examples(DataConfig(task="piecewise"), seed=0)
    assert len(train) == 1


# -------------------------------------------------------------------------- prepare


def test_prepare_gsm8k_fixture():
    from reasonrl.data.formats import GSM8K_INSTRUCTION
    from reasonrl.data.prepare import convert

    records = convert("gsm8k", FIXTURES / "gsm8k" / "train.jsonl")
    assert len(records) == 20
    first = records[0]
    assert first["ground_truth"] == "72" and first["data_source"] == "gsm8k"
    assert first["prompt"].startswith("Natalia sold clips") and first["prompt"].endswith(GSM8K_INSTRUCTION)
    assert first["extra_info"]["solution"].endswith("#### 72")
    assert all("," not in r["ground_truth"] for r in records)
    assert len(convert("gsm8k", FIXTURES / "gsm8k" / "train.jsonl", instruction="", limit=3)) == 3


@pytest.mark.parametrize("line, needle", [
    ('{"question": "q"}', "missing field 'answer'; the record has question"),
    ('{"question": "q", "answer": "no marker"}', "field 'answer' must end in '#### <number>'"),
    ('{"question": "q", "answer": "#### many"}', "field 'answer'"),
    ('{"answer": "#### 1"}', "missing field 'question'; the record has answer"),
])
def test_prepare_gsm8k_errors(tmp_path, line, needle):
    from reasonrl.data.prepare import convert

    path = write_lines(tmp_path, ['{"question": "q", "answer": "#### 1"}', line])
    with pytest.raises(DataError, match=rf"data\.jsonl:2: {needle}"):
        convert("gsm8k", path)


def test_prepare_math_fixture_and_official_folder(tmp_path):
    from reasonrl.data.prepare import convert

    records = convert("math", FIXTURES / "math_style.jsonl")
    assert len(records) == 14
    assert records[0]["ground_truth"] == "\\frac{1}{2}"  # last \boxed of the solution
    assert records[5]["ground_truth"] == "1024"  # the answer field wins
    assert records[0]["extra_info"]["level"] == "Level 1" and records[0]["data_source"] == "math"
    folder = tmp_path / "MATH" / "train" / "algebra"
    folder.mkdir(parents=True)
    for i, line in enumerate((FIXTURES / "math_style.jsonl").read_text().splitlines()[:3]):
        (folder / f"{i}.json").write_text(line)
    assert [r["ground_truth"] for r in convert("math", tmp_path / "MATH")] == [
        r["ground_truth"] for r in records[:3]]
    (folder / "9.json").write_text(json.dumps({"problem": "p", "solution": "no box"}))
    with pytest.raises(DataError, match=r"9\.json:1: field 'solution' has no \\boxed"):
        convert("math", tmp_path / "MATH")


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_prepare_writes_files_the_loader_reads(tmp_path, suffix):
    from reasonrl.data.prepare import prepare

    for task in ("countdown", "piecewise"):
        out = tmp_path / f"{task}.{suffix}"
        assert prepare(task, out, size=5, seed=3) == 5
        examples = load_file(out)
        assert len(examples) == 5 and {e.data_source for e in examples} == {task}
        assert "solution" in examples[0].meta
    out = tmp_path / f"gsm8k.{suffix}"
    prepare("gsm8k", out, FIXTURES / "gsm8k" / "test.jsonl")
    assert len(load_file(out)) == 10
    with pytest.raises(DataError, match="--input is required"):
        prepare("math", out)


# -------------------------------------------- Countdown-Tasks-3to4, templates, unused options


@pytest.mark.parametrize("name", ["countdown_3to4.jsonl", "countdown_3to4.parquet"])
def test_prepare_countdown_converts_tinyzero_records(tmp_path, name):
    """TinyZero's layout ({"target", "nums"}) -> its question, ground truth {"numbers", "target"},
    data_source countdown; --skip / --limit take TinyZero's train/test windows."""
    from reasonrl.data.formats import TINYZERO_COUNTDOWN
    from reasonrl.data.prepare import prepare

    src = FIXTURES / "recipes" / name
    lines = (FIXTURES / "recipes" / "countdown_3to4.jsonl").read_text().splitlines()
    raw = [json.loads(line) for line in lines]
    assert prepare("countdown", tmp_path / "train.jsonl", src, limit=8) == 8
    assert prepare("countdown", tmp_path / "test.jsonl", src, skip=8) == len(raw) - 8 == 4
    train, test = load_file(tmp_path / "train.jsonl"), load_file(tmp_path / "test.jsonl")
    first, last = train[0], test[-1]
    assert first.prompt == TINYZERO_COUNTDOWN.format(numbers=raw[0]["nums"], target=raw[0]["target"])
    assert "each number can only be used once" in first.prompt
    assert json.loads(first.ground_truth) == {"numbers": raw[0]["nums"], "target": raw[0]["target"]}
    assert first.data_source == "countdown" and first.meta["index"] == 0 and last.meta["index"] == 11
    assert json.loads(last.ground_truth)["target"] == raw[11]["target"]


@pytest.mark.parametrize("line, needle", [
    ('{"nums": [1, 2]}', "missing field 'target'; the record has nums"),
    ('{"target": "24", "nums": [1, 2]}', "field 'target' must be an integer"),
    ('{"target": 24, "nums": []}', "field 'nums' must be a non-empty list of integers"),
    ('{"target": 24, "nums": [1, 2.5]}', "field 'nums' must be a non-empty list of integers"),
    ('[24, [1, 2]]', "expected a JSON object"),
])
def test_prepare_countdown_errors_name_file_line_and_field(tmp_path, line, needle):
    from reasonrl.data.prepare import convert

    path = write_lines(tmp_path, ['{"target": 3, "nums": [1, 2]}', line])
    with pytest.raises(DataError, match=rf"data\.jsonl:2: {needle}"):
        convert("countdown", path)


def test_prepare_with_nothing_to_write_says_why(tmp_path):
    """No record to write is one error saying why: a --skip past the input's end (TinyZero's test
    window on a small file) names the input's count and --skip; an empty input and --size 0 too;
    negative counts are refused."""
    from reasonrl.config import ConfigError
    from reasonrl.data.prepare import prepare

    src, out = FIXTURES / "recipes" / "countdown_3to4.parquet", tmp_path / "test.jsonl"
    with pytest.raises(DataError, match=r"countdown_3to4\.parquet: no records to write: the input has 12 "
                                        r"records and --skip 327680 passed them all"):
        prepare("countdown", out, src, skip=327680, limit=1024)
    with pytest.raises(DataError, match=r"--skip 12 passed them all"):
        prepare("countdown", out, src, skip=12)
    assert prepare("countdown", tmp_path / "last.jsonl", src, skip=11) == 1
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match=r"empty\.jsonl: no records to write: the input holds none"):
        prepare("gsm8k", out, empty)
    with pytest.raises(DataError, match=r"data prepare piecewise: --size 0: no records to write"):
        prepare("piecewise", out, size=0)
    with pytest.raises(ConfigError, match=r"data prepare countdown: --limit -2, --skip -1: must be >= 0"):
        prepare("countdown", out, src, skip=-1, limit=-2)
    assert not out.exists()


def test_prepare_r1_zero_template_writes_reasonrl_prompts():
    from reasonrl.data.formats import R1_ZERO_TEMPLATE
    from reasonrl.data.prepare import convert

    (record,) = convert("gsm8k", FIXTURES / "gsm8k" / "train.jsonl", limit=1, template="r1_zero")
    question = record["extra_info"]["question"]
    assert record["prompt"] == R1_ZERO_TEMPLATE.format(question=question.strip())
    assert record["prompt"].endswith(f"User: {question.strip()}\nAssistant: <think>")
    assert record["ground_truth"] == "72"
    # the repository's fixture in ReasonRL's own layout is exactly this, without the extras
    theirs = json.loads((FIXTURES / "recipes" / "reasonrl_gsm8k_train.jsonl").read_text().splitlines()[0])
    assert theirs == {"prompt": record["prompt"], "ground_truth": "72"}


@pytest.mark.parametrize("task, options, needle", [
    ("countdown", {"input": "x.jsonl", "size": 5}, "--size not used when converting --input (it uses "
                                                   "--input, --limit, --skip)"),
    ("countdown", {"input": "x.jsonl", "seed": 1}, "--seed not used when converting --input"),
    ("countdown", {"input": "x.jsonl", "instruction": "hi"}, "--instruction not used"),
    ("countdown", {"limit": 5}, "--limit not used when generating (it uses --seed, --size)"),
    ("piecewise", {"input": "x.jsonl"}, "--input not used (piecewise problems are generated)"),
    ("piecewise", {"skip": 2}, "--skip not used when generating"),
    ("gsm8k", {"input": "x.jsonl", "size": 10}, "--size not used when converting --input"),
    ("math", {"input": "x.jsonl", "seed": 3, "size": 9}, "--size, --seed not used"),
    ("gsm8k", {"input": "x.jsonl", "template": "r1_zero", "instruction": "hi"},
     "--instruction not used with --template r1_zero"),
])
def test_prepare_options_given_but_unused_are_errors(tmp_path, task, options, needle):
    from reasonrl.config import ConfigError
    from reasonrl.data.prepare import prepare

    with pytest.raises(ConfigError) as err:
        prepare(task, tmp_path / "out.jsonl", options.pop("input", None), **options)
    assert needle in str(err.value)
    assert not (tmp_path / "out.jsonl").exists()


# ------------------------------------------------------------------------ system prompt


@pytest.mark.parametrize("task, configured, expected", [
    ("arithmetic", "auto", "calculator"),  # arithmetic keeps its calculator prompt
    ("file", "auto", ""),  # a file task gets none unless the config sets one
    ("countdown", "auto", ""),
    ("piecewise", "auto", ""),
    ("file", "Be brief.", "Be brief."),
    ("arithmetic", "", ""),
])
def test_system_prompt_rule(task, configured, expected):
    from reasonrl.config import DEFAULT_SYSTEM_PROMPT
    from reasonrl.data import system_prompt_for

    found = system_prompt_for(DataConfig(task=task, system_prompt=configured))
    assert found == (DEFAULT_SYSTEM_PROMPT if expected == "calculator" else expected)


def test_a_gsm8k_file_is_not_told_to_answer_like_a_calculator(tmp_path, tokenizer):
    """Through the worker the run builds: a file task's prompt has no system turn by default."""
    from reasonrl.config import load_config
    from reasonrl.data import system_prompt_for
    from reasonrl.rollout import RolloutWorker

    cfg = load_config("configs/gsm8k.yaml", ["data.system_prompt=auto"])
    worker = RolloutWorker(None, tokenizer, True, system_prompt_for(cfg.data), 512)  # as placement builds it
    text = tokenizer.decode(worker.encode(Example("How many eggs?", "3", "gsm8k")))
    assert "calculator" not in text and "How many eggs?" in text
    arith = RolloutWorker(None, tokenizer, True, system_prompt_for(load_config(None).data), 512)
    assert "careful calculator" in tokenizer.decode(arith.encode(Example("What is 2 + 3?", "5", "a")))


# ------------------------------------------------------------------------ prompt length


def test_prompts_too_long_are_all_listed_or_cut_from_the_left(tmp_path, tokenizer):
    from reasonrl.rollout import RolloutWorker, check_prompt_lengths

    examples = [Example(" ".join(["word"] * n), "1", "s", {"origin": f"d.jsonl:{i}"})  # n tokens
                for i, n in enumerate([5, 200, 3, 300] + [250] * 11, start=1)]
    worker = RolloutWorker(None, tokenizer, False, "", 100)
    with pytest.raises(DataError) as err:
        check_prompt_lengths(worker, examples, 100)
    message = str(err.value)
    assert message.startswith("13 prompt(s) longer than data.max_prompt_tokens=100: d.jsonl:2 (200 tokens); "
                              "d.jsonl:4 (300 tokens); d.jsonl:5 (250 tokens)")
    assert "; and 3 more. Raise data.max_prompt_tokens" in message and "truncate_prompts=left" in message
    left = RolloutWorker(None, tokenizer, False, "", 100, truncate_prompts="left")
    check_prompt_lengths(left, examples, 100)  # nothing raised
    full = tokenizer(examples[1].prompt, add_special_tokens=False)["input_ids"]
    assert left.encode(examples[1]) == full[-100:]  # the last 100 tokens, as TRL's left truncation
    assert left.encode(examples[0]) == worker.encode(examples[0])  # short prompts untouched
    assert left.encode(examples[1], whole=True) == worker.encode(examples[1], whole=True) == full


def test_prompts_cut_from_the_left_are_counted_in_one_line(tokenizer, capsys):
    """Issue 40: data.truncate_prompts=left cut prompts without a word. Now the start-up check
    says how many train and held-out prompts are cut and by how many tokens at most (the
    prompt that loses most named), and returns those counts."""
    from reasonrl.rollout import RolloutWorker, check_prompt_lengths, prompt_cuts

    def words(n: int, line: int) -> Example:  # n tokens
        return Example(" ".join(["word"] * n), "1", "s", {"origin": f"d.jsonl:{line}"})

    train = [words(n, i) for i, n in enumerate([5, 130, 3, 100, 101], start=1)]
    held_out = [words(n, i) for i, n in enumerate([140, 7], start=1)]
    left = RolloutWorker(None, tokenizer, False, "", 100, truncate_prompts="left")
    assert prompt_cuts(left, train + held_out, 100) == [0, 30, 0, 0, 1, 40, 0]
    counts = check_prompt_lengths(left, train, 100, held_out=held_out)
    assert counts == {"train": 2, "held_out": 1, "most": 40}
    assert capsys.readouterr().out == (
        "[reasonrl] data.truncate_prompts=left: 2 of 5 train prompts and 1 of 2 held-out prompts are longer "
        "than data.max_prompt_tokens=100 and are cut from the left, by at most 40 tokens (d.jsonl:1)\n")
    assert check_prompt_lengths(left, train[:1], 100) == {"train": 0, "held_out": 0, "most": 0}
    assert capsys.readouterr().out == ""  # nothing cut: nothing said
    check_prompt_lengths(left, train, 100, held_out=[])  # a run without a held-out set
    assert capsys.readouterr().out.startswith("[reasonrl] data.truncate_prompts=left: 2 of 5 train prompts "
                                              "are longer than data.max_prompt_tokens=100 and are cut")
    check_prompt_lengths(left, train, 100)  # `reasonrl eval`: one set
    assert capsys.readouterr().out.startswith("[reasonrl] data.truncate_prompts=left: 2 of 5 prompts are "
                                              "longer")


def test_a_run_that_cuts_prompts_says_so_and_counts_them_per_step(tmp_path, capsys, tokenizer):
    """The run's view: the start-up line, and data/truncated_prompts in each step's metrics:
    every prompt of the train file is cut, so each step counts all its prompts (2 per step)."""
    from reasonrl.cli import main

    repo = Path(__file__).parents[2]
    long = "Add these numbers: " + " + ".join(str(i) for i in range(40)) + ". What is the sum?"
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"{i}. {long}", "ground_truth": "780"}) + "\n"
                             for i in range(6)))
    val.write_text(json.dumps({"prompt": long, "ground_truth": "780"}) + "\n"
                   + json.dumps({"prompt": "1 + 1?", "ground_truth": "2"}) + "\n")
    code = main(["train", str(repo / "configs" / "smoke.yaml"), "data.task=file", f"data.train_path={train}",
                 f"data.val_path={val}", "data.max_prompt_tokens=24", "data.truncate_prompts=left",
                 "data.apply_chat_template=false",
                 f"trainer.output_dir={tmp_path}", "trainer.run_name=r", "trainer.progress=false",
                 "trainer.threads=1", "tracking.report=false"])
    out = capsys.readouterr().out
    assert code == 0
    most = len(tokenizer(f"0. {long}", add_special_tokens=False)["input_ids"]) - 24
    assert [x for x in out.splitlines() if "data.truncate_prompts=left" in x] == [
        "[reasonrl] data.truncate_prompts=left: 6 of 6 train prompts and 1 of 2 held-out prompts are longer "
        f"than data.max_prompt_tokens=24 and are cut from the left, by at most {most} tokens ({train}:1)"]
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["data/truncated_prompts"] for r in rows if r.get("step", 0) > 0] == [2.0, 2.0]
