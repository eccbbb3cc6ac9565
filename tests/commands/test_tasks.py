"""The task commands end to end: `reasonrl data prepare`, `reasonrl reward`, and two training
steps of every task config (gsm8k, math, countdown, piecewise) on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reasonrl.cli import main
from reasonrl.config import load_config
from reasonrl.train.trainer import Trainer

FIXTURES = Path(__file__).parents[1] / "fixtures"
CD = '{"numbers": [3, 5, 7, 9], "target": 24}'


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


# ---------------------------------------------------------------------------- reward


@pytest.mark.parametrize("args, score, parts", [
    (["--task", "gsm8k", "--ground-truth", "72", "so #### $72.00"], 1.0, {}),
    (["--task", "countdown", "--ground-truth", CD, "<answer>3 * 5 + 9</answer>"], 1.0,
     {"format": 1.0, "valid": 1.0, "equals_target": 1.0}),
    (["--task", "countdown", "--ground-truth", CD, "<answer>__import__('os')</answer>"], 0.0,
     {"format": 0.0, "valid": 0.0, "equals_target": 0.0}),
    (["--task", "math", "--ground-truth", "\\frac{1}{2}", "so \\boxed{0.5}"], 1.0, {"answer_found": 1.0}),
    (["--ground-truth", "5", "The answer is 5."], 1.0, {}),  # default: the numeric check
])
def test_reward_command_prints_score_and_components(capsys, args, score, parts):
    assert main(["reward", *args]) == 0
    (row,) = json_lines(capsys.readouterr().out)
    assert row["score"] == score and row["components"] == {"correct": score} and row["parts"] == parts
    assert row["timeout"] is False and row["error"] is None


def test_reward_command_timeout(capsys):
    args = ["--task", "math", "--timeout", "1", "--ground-truth", "5", "\\boxed{9^{9^{9}}}"]
    assert main(["reward", *args]) == 0
    (row,) = json_lines(capsys.readouterr().out)
    assert row["score"] == 0.0 and row["timeout"] is True


def test_reward_command_file_with_weights_from_a_config(tmp_path, capsys):
    records = [
        {"completion": "#### 72", "ground_truth": "72", "task": "gsm8k"},
        {"completion": "<answer>3 * 5 + 7</answer>", "ground_truth": CD, "task": "countdown"},
        {"completion": "<think>a</think><answer>\\boxed{5}</answer>", "ground_truth": 5},
        {"completion": "a = -3, b = 3, \\boxed{0}", "ground_truth": '{"k": 2, "a": -3, "b": 3}',
         "data_source": "piecewise"},
    ]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    config = tmp_path / "r.yaml"
    config.write_text("reward:\n  weights: {correct: 1.0, format: 0.5}\n")
    assert main(["reward", "--file", str(path), "--config", str(config)]) == 0
    *rows, summary = json_lines(capsys.readouterr().out)
    assert [r["task"] for r in rows] == ["gsm8k", "countdown", "numeric", "piecewise"]
    assert [r["where"] for r in rows] == [f"{path}:{i}" for i in range(1, 5)]
    assert [r["components"]["correct"] for r in rows] == [1.0, 0.1, 1.0, 0.6]
    assert rows[2]["score"] == 1.5 and rows[2]["components"]["format"] == 1.0
    assert summary["summary"]["records"] == 4 and summary["summary"]["solved"] == 2


@pytest.mark.parametrize("line, needle", [
    ('{"completion": "x"}', ":2: field 'ground_truth'"),
    ('{"completion": "x", "ground_truth": "1", "task": "chess"}', ":2: field 'task': unknown task"),
    ('{"completion": "x", "ground_truth": "one"}', ":2: field 'ground_truth'"),
    ("not json", ":2: not valid JSON"),
])
def test_reward_command_file_errors_name_the_line(tmp_path, capsys, line, needle):
    path = tmp_path / "c.jsonl"
    path.write_text('{"completion": "1", "ground_truth": "1"}\n' + line + "\n")
    assert main(["reward", "--file", str(path)]) == 2
    assert f"{path}{needle}" in capsys.readouterr().err


def test_reward_command_custom_fn(capsys):
    assert main(["reward", "--fn", f"{FIXTURES / 'custom_reward.py'}:keyword", "--ground-truth", "42",
                 "it is 42"]) == 0
    (row,) = json_lines(capsys.readouterr().out)
    assert row["task"] == "custom" and row["score"] == 1.0 and row["parts"]["found"] == 1.0


def test_reward_command_needs_input(capsys):
    assert main(["reward", "--task", "gsm8k", "some text"]) == 2
    assert "--ground-truth" in capsys.readouterr().err


# --------------------------------------------------------------------------- prepare


def test_data_prepare_command(tmp_path, capsys):
    out = tmp_path / "g.parquet"
    assert main(["data", "prepare", "gsm8k", "--input", str(FIXTURES / "gsm8k" / "train.jsonl"),
                 "--output", str(out), "--limit", "5"]) == 0
    assert "wrote 5 gsm8k records" in capsys.readouterr().out and out.is_file()
    assert main(["data", "prepare", "countdown", "--output", str(tmp_path / "c.jsonl"), "--size", "7"]) == 0
    assert len((tmp_path / "c.jsonl").read_text().splitlines()) == 7
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "no final answer"}\n')
    assert main(["data", "prepare", "gsm8k", "--input", str(bad), "--output", str(tmp_path / "x.jsonl")]) == 2
    assert f"{bad}:1: field 'answer'" in capsys.readouterr().err


# ------------------------------------------------------------ training, every task

TINY = ["model.path=tiny", "trainer.steps=2", "trainer.batch_size=8", "rollout.n=4",
        "rollout.max_new_tokens=12", "trainer.progress=false", "optim.micro_batch_size=8"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """GSM8K and MATH files made by the prepare command from the repo's fixtures."""
    root = tmp_path_factory.mktemp("prepared")
    for task, src, name in [("gsm8k", FIXTURES / "gsm8k" / "train.jsonl", "gsm8k_train.jsonl"),
                            ("gsm8k", FIXTURES / "gsm8k" / "test.jsonl", "gsm8k_test.parquet"),
                            ("math", FIXTURES / "math_style.jsonl", "math.jsonl")]:
        assert main(["data", "prepare", task, "--input", str(src), "--output", str(root / name)]) == 0
    return root


@pytest.mark.parametrize("config", ["gsm8k", "math", "countdown", "piecewise"])
def test_every_task_config_trains_two_steps(tmp_path, prepared, config):
    files = {"gsm8k": [f"data.train_path={prepared / 'gsm8k_train.jsonl'}",
                       f"data.val_path={prepared / 'gsm8k_test.parquet'}", "data.format="],
             "math": [f"data.train_path={prepared / 'math.jsonl'}",
                      f"data.val_path={prepared / 'math.jsonl'}"],
             "countdown": ["data.countdown.train_size=50", "data.countdown.val_size=4"],
             "piecewise": []}[config]
    assert main(["train", f"configs/{config}.yaml", *TINY, *files, "data.val_size=4",
                 f"trainer.output_dir={tmp_path}", "trainer.run_name=r"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    for key in ("reward/mean", "reward/correct", "reward/accuracy", "reward/errors", "reward/timeouts"):
        assert key in lines[1], key
    assert lines[1]["reward/errors"] == 0
    assert "eval/accuracy" in lines[0] and "eval/reward_timeouts" in lines[2]


def test_mixed_validation_sources_are_reported_separately(tmp_path, prepared):
    cfg = load_config("configs/gsm8k.yaml", [
        *TINY, "reward.task=auto", "data.format=", f"data.train_path={prepared / 'gsm8k_train.jsonl'}",
        f"data.val_path={prepared / 'gsm8k_test.parquet'},{prepared / 'math.jsonl'}", "data.val_size=6",
        f"trainer.output_dir={tmp_path}"])
    trainer = Trainer(cfg)
    assert sorted({e.data_source for e in trainer.held_out}) == ["gsm8k", "math"]
    metrics = trainer.evaluate()
    assert metrics["eval/gsm8k/num_prompts"] == 3 and metrics["eval/math/num_prompts"] == 3
    for key in ("eval/gsm8k/accuracy", "eval/math/accuracy", "eval/math/reward_mean"):
        assert 0.0 <= metrics[key] <= 1.0


def test_missing_prepared_file_says_how_to_make_it(tmp_path, capsys):
    assert main(["train", "configs/gsm8k.yaml", *TINY, f"data.train_path={tmp_path}/none.jsonl",
                 "data.val_path="]) == 2
    assert "reasonrl data prepare" in capsys.readouterr().err


def test_bad_ground_truth_fails_before_training(tmp_path, capsys):
    data = tmp_path / "t.jsonl"
    data.write_text('{"prompt": "q", "ground_truth": "1", "data_source": "gsm8k"}\n'
                    '{"prompt": "q", "ground_truth": "many", "data_source": "gsm8k"}\n')
    assert main(["train", "configs/smoke.yaml", "data.task=file", f"data.train_path={data}",
                 f"trainer.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert f"{data}:2: field 'ground_truth'" in err
    assert not (tmp_path / "smoke").exists()


# ---------------------------------------------------------------------- config keys


@pytest.mark.parametrize("override, needle", [
    ("reward.task=chess", "reward.task: 'chess' is not allowed; allowed values: auto, numeric, gsm8k"),
    ("reward.timeout=0", "reward.timeout: must be > 0"),
    ("reward.num_workers=0", "reward.num_workers: must be >= 1"),
    ("reward.countdown_format_score=2", "reward.countdown_format_score: must be in [0, 1]"),
    ("reward.fn=no_colon", "reward.fn: expected module:function"),
    ("data.fields={answer: x}", "data.fields.answer: unknown field; allowed: prompt, messages"),
    ("data.task=file", "data.train_path: required when data.task=file"),
    ("data.countdown.max_numbers=9", "data.countdown.max_numbers: must be in [2, 6], got 9"),
    ("data.countdown.min_numbers=5", "data.countdown: need 2 <= min_numbers <= max_numbers <= 6"),
    ("data.piecewise.val_variants=-1", "data.piecewise.val_variants: must be >= 0, got -1"),
])
def test_task_config_errors_name_the_key(override, needle):
    from reasonrl.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert needle in str(info.value)
