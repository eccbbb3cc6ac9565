"""The five recipes of configs/recipes/ (ReasonRL, trl_GRPO, Verl Study / TinyZero, Transparent
GRPO, EasyRL) train end to end on the tiny model, each with its data in its source system's
layout and its own reward semantics, and their headers name what they reproduce."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import needs_peft

from reasonrl.cli import main
from reasonrl.config import load_config

FIXTURES = Path(__file__).parents[1] / "fixtures"
RECIPES = Path(__file__).parents[2] / "configs" / "recipes"
NAMES = ["reasonrl_strict_math", "trl_grpo_format", "verl_countdown", "transparent_grpo_piecewise",
         "easyrl_math"]
LORA_RECIPES = {"reasonrl_strict_math", "trl_grpo_format"}  # their tests train a LoRA adapter
TINY = ["model.path=tiny", "trainer.batch_size=8", "rollout.n=4", "rollout.max_new_tokens=12",
        "trainer.progress=false", "optim.micro_batch_size=8", "tracking.report=false"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Each recipe's files, made the way its header says (from the repository's fixtures)."""
    root = tmp_path_factory.mktemp("recipes")
    tags = ("Reason inside <think> </think>, then give the final answer as \\boxed{} inside "
            "<answer> </answer>.")
    for src, name in [("train", "tags_train.jsonl"), ("test", "tags_test.jsonl")]:
        assert main(["data", "prepare", "gsm8k", "--input", str(FIXTURES / "gsm8k" / f"{src}.jsonl"),
                     "--output", str(root / name), "--instruction", tags]) == 0
    cd = FIXTURES / "recipes" / "countdown_3to4.parquet"
    assert main(["data", "prepare", "countdown", "--input", str(cd), "--limit", "8",
                 "--output", str(root / "cd_train.jsonl")]) == 0
    assert main(["data", "prepare", "countdown", "--input", str(cd), "--skip", "8",
                 "--output", str(root / "cd_test.jsonl")]) == 0
    return root


def overrides(name: str, data: Path) -> list[str]:
    recipes = FIXTURES / "recipes"
    return {
        "reasonrl_strict_math": [f"data.train_path={recipes / 'reasonrl_gsm8k_train.jsonl'}",
                                 f"data.val_path={recipes / 'reasonrl_gsm8k_test.jsonl'}", "trainer.steps=2",
                                 "model.lora.rank=4", "trainer.eval_every=0", "trainer.save_every=0"],
        # epochs=0.1 of 20 prompts at 2 prompts per step: ceil(0.1 x 20 / 2) = 1 step
        "trl_grpo_format": [f"data.train_path={data / 'tags_train.jsonl'}",
                            f"data.val_path={data / 'tags_test.jsonl'}", "trainer.epochs=0.1",
                            "model.lora.rank=4", "data.val_size=3"],
        "verl_countdown": [f"data.train_path={data / 'cd_train.jsonl'}",
                           f"data.val_path={data / 'cd_test.jsonl'}", "trainer.epochs=0", "trainer.steps=2",
                           "trainer.eval_every=0", "trainer.save_every=0"],
        "transparent_grpo_piecewise": ["trainer.steps=2"],
        "easyrl_math": [f"data.train_path={recipes / 'easyrl_train.parquet'}",
                        f"data.val_path={recipes / 'easyrl_valid.parquet'}", "trainer.steps=2",
                        "trainer.eval_every=0", "eval.max_new_tokens=8"],
    }[name]


# what each recipe must log beyond the common metrics: its reward semantics at work
EXPECTED = {
    "reasonrl_strict_math": ["reward/format_r1_zero", "reward/correct"],
    "trl_grpo_format": ["reward/format_trl_grpo", "reward/correct"],
    "verl_countdown": ["train/kl_in_reward"],
    "transparent_grpo_piecewise": ["train/kl_in_reward"],
    "easyrl_math": [],
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=needs_peft) if n in LORA_RECIPES else n
                                  for n in NAMES])
def test_every_recipe_trains_on_the_tiny_model(tmp_path, data, name):
    args = ["train", str(RECIPES / f"{name}.yaml"), *TINY, *overrides(name, data),
            f"trainer.output_dir={tmp_path}", "trainer.run_name=r"]
    assert main(args) == 0
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    steps = [x["step"] for x in lines]
    assert steps == ([0, 1] if name == "trl_grpo_format" else [0, 1, 2])
    for key in ("reward/mean", "reward/errors", "reward/timeouts", "train/loss", *EXPECTED[name]):
        assert key in lines[1], key
    assert lines[1]["reward/errors"] == 0 and lines[1]["reward/timeouts"] == 0
    assert "eval/accuracy" in lines[0] and "eval/accuracy" in lines[-1]
    if name == "easyrl_math":  # records' own pass@k, overall and per extra_info.data_source
        first = lines[0]
        assert first["eval/num_prompts"] == 6 and first["eval/num_samples"] == 3 * 4 + 3 * 1
        for key in ("eval/pass@1", "eval/pass@4", "eval/math500/pass@4", "eval/gsm8k/pass@1"):
            assert key in first, key
        assert "eval/gsm8k/pass@4" not in first


@pytest.mark.parametrize("name", NAMES)
def test_every_recipe_header_says_what_it_reproduces(name):
    """A header comment with the source's settings key by key (`setting -> here`) that are real
    keys of the config, and a section on where reasonrl differs on purpose."""
    text = (RECIPES / f"{name}.yaml").read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert len(header) > 20
    assert any("Where reasonrl differs on purpose" in line for line in header)
    mapped = [line for line in header if "->" in line]
    assert len(mapped) >= 8
    cfg = load_config(RECIPES / f"{name}.yaml")
    ours = "\n".join(line.split("->", 1)[1] for line in mapped)  # reasonrl's side of each mapping
    keys = set(re.findall(r"\b((?:model|data|rollout|reward|algo|optim|eval|trainer)\.[a-z_]+(?:\.[a-z_]+)?)",
                          ours))
    assert keys
    for key in keys:
        node = cfg
        for part in key.split("."):
            assert hasattr(node, part), key
            node = getattr(node, part)


@pytest.mark.parametrize("epochs, prompts, steps", [(1, 20, 10), (0.25, 20, 3), (2, 7, 7), (0.01, 5, 1)])
def test_epochs_count_steps_over_the_training_prompts(epochs, prompts, steps):
    """steps = ceil(epochs x prompts / (batch_size / n)): 8 completions of 4 = 2 prompts per step."""
    from reasonrl.train.trainer import with_epochs

    cfg = load_config(None, [f"trainer.epochs={epochs}", "trainer.batch_size=8", "rollout.n=4"])
    assert with_epochs(cfg, prompts).trainer.steps == steps
    assert with_epochs(load_config(None, ["trainer.steps=7"]), prompts).trainer.steps == 7  # epochs 0


# ----------------------------------------------- the examples, through the command line


def rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("recipe, completion, score", [
    ("reasonrl_strict_math", "\\boxed{4}", 0.0),  # right answer, no format: ReasonRL's 0.0
    ("reasonrl_strict_math", "so </think> <answer>4</answer>", 1.0),
    ("reasonrl_strict_math", "so </think> <answer>5</answer>", 0.0),
    ("trl_grpo_format", "<think>x</think> so <answer>\\boxed{4}</answer>", 2.0),  # accuracy 1 + format 1
    # no \boxed{}: format 0.5, and TRL's accuracy_reward reads no bare 4 (no LaTeX anchor)
    ("trl_grpo_format", "<think>x</think> so <answer>4</answer>", 0.5),
    ("trl_grpo_format", "<think>x</think> so <answer>$4$</answer>", 1.5),
])
def test_recipe_rewards_from_the_command_line(capsys, recipe, completion, score):
    config = str(RECIPES / f"{recipe}.yaml")
    assert main(["reward", "--config", config, "--ground-truth", "4", completion]) == 0
    (row,) = rows(capsys.readouterr().out)
    assert row["score"] == score and row["error"] is None


def test_unreadable_math_ground_truth_stops_the_run_naming_file_and_line(tmp_path, capsys):
    assert main(["reward", "--task", "math", "--ground-truth", "@@@", "\\boxed{4}"]) == 2  # not a silent 0
    assert "math-verify cannot read ground truth '@@@'" in capsys.readouterr().err
    data = tmp_path / "m.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "ground_truth": t}) + "\n"
                            for i, t in enumerate(["4", "\\frac{1}{2}", "@@@"])))
    assert main(["train", "configs/math.yaml", *TINY, f"data.train_path={data}", "data.val_path=",
                 f"trainer.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert f"{data}:3: field 'ground_truth': math-verify cannot read ground truth '@@@'" in err
    assert not any(tmp_path.glob("*/metrics.jsonl"))  # stopped before training
