"""End to end: the CLI writes a complete run directory, errors are clean, and a policy learns."""

import collections
import json

import pytest
import torch
import yaml
from helpers import patch_entry
from transformers import AutoModelForCausalLM

from reasonrl.cli import main
from reasonrl.config import load_config
from reasonrl.model.load import load_model_and_tokenizer
from reasonrl.registry import REWARD_COMPONENTS
from reasonrl.rollout import SamplingParams
from reasonrl.train.trainer import Trainer


def run_cli(tmp_path, *overrides):
    return main(["train", "configs/smoke.yaml", f"trainer.output_dir={tmp_path}",
                 "trainer.run_name=r", "trainer.progress=false", *overrides])


def test_smoke_run_writes_the_run_directory(tmp_path, capsys, monkeypatch):
    from reasonrl.rollout.hf import HFEngine

    closed = []
    monkeypatch.setattr(HFEngine, "close", lambda self: closed.append(self))
    assert run_cli(tmp_path) == 0
    assert len(closed) == 1  # the run's engine was freed at the end
    run = tmp_path / "r"
    out = capsys.readouterr().out
    assert "held-out accuracy before training" in out and "before ->" in out

    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["path"] == "tiny" and saved["trainer"]["steps"] == 2

    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    assert lines[0]["eval/num_prompts"] == 8.0
    for key in ("reward/mean", "reward/std", "reward/correct", "reward/accuracy", "advantage/mean",
                "train/loss", "train/entropy", "train/clip_frac", "train/grad_norm", "train/lr",
                "rollout/response_length_mean", "rollout/response_length_max",
                "rollout/truncated_frac", "rollout/tokens_per_s", "time/rollout", "time/reward",
                "time/update", "time/sync", "time/step"):
        assert key in lines[1], key
    assert "eval/accuracy" in lines[2]  # final eval on the last step

    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {1, 2} and len(samples) == 4  # batch 8 / n 4 = 2 groups
    assert {"prompt", "completion", "reward", "components", "ground_truth"} <= set(samples[0])

    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and "eval/accuracy" in summary["eval_after"]

    ckpt = run / "checkpoints" / "step_2"
    hf = AutoModelForCausalLM.from_pretrained(ckpt / "huggingface")
    ours, tok = load_model_and_tokenizer(str(ckpt))  # a checkpoint folder works as model.path
    for (name, a), (_, b) in zip(hf.state_dict().items(), ours.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert tok.eos_token == "<|im_end|>"
    assert not list((run / "checkpoints").glob(".*"))  # no temp dirs left behind


def test_existing_run_directory_is_refused(tmp_path, capsys):
    assert run_cli(tmp_path) == 0
    assert run_cli(tmp_path) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_unknown_key_fails_before_any_work(tmp_path, capsys):
    assert run_cli(tmp_path, "algo.clip_hgh=0.3") == 2
    err = capsys.readouterr().err
    assert "algo.clip_hgh" in err and "clip_high" in err
    assert not (tmp_path / "r").exists()


def test_missing_model_folder_is_a_clear_error(tmp_path, capsys):
    assert run_cli(tmp_path, f"model.path={tmp_path}/nope") == 2
    assert "no such folder" in capsys.readouterr().err


def test_malformed_data_line_names_file_and_line(tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1?", "ground_truth": "2"}\n{"prompt": "2+2?"}\n')
    assert run_cli(tmp_path, "data.task=jsonl", f"data.train_path={data}") == 2
    err = capsys.readouterr().err
    assert f"{data}:2" in err and "ground_truth" in err


def test_policy_learns_a_trivial_reward(tmp_path, monkeypatch):
    """GRPO on the tiny model: reward = share of completion tokens that are one chosen token.

    The embeddings are scaled up so the random model's next-token distribution is peaked
    enough that the chosen token (the one it already emits most) starts at a low but
    non-zero rate; the reward must then rise clearly within a dozen steps.

    Which tokens are sampled depends on the CPU's rounding, so the trajectory does too; lr 5e-3
    makes the verdict not depend on it. Perturbed here by a relative 1e-6 on the embeddings (a
    rounding's size), 6 of 6 runs rise alike (last three steps 0.73-0.77 from 0.04); at lr 1e-2,
    1 of 8 collapsed to 0 after step 4 and never rose.
    """
    cfg = load_config("configs/smoke.yaml", [
        f"trainer.output_dir={tmp_path}", "trainer.progress=false", "trainer.steps=12",
        "trainer.batch_size=32", "rollout.n=8", "rollout.max_new_tokens=8", "optim.lr=5e-3",
        "data.arithmetic.val_size=0"])
    trainer = Trainer(cfg)
    with torch.no_grad():
        trainer.policy.model.get_input_embeddings().weight.mul_(8.0)  # tied: also the LM head
    torch.manual_seed(0)
    first = trainer.rollout.rollout(trainer.train_examples[:8], SamplingParams(n=8, max_new_tokens=8))
    target_id, count = collections.Counter(t for c in first.completion_ids for t in c).most_common(1)[0]
    target = trainer.workers.tokenizer.decode([target_id])
    assert count / 512 < 0.25  # starts rare

    def emits_target(completion: str, ground_truth: str, fallback_last_number: bool = True) -> float:
        return min(completion.count(target) / 8, 1.0)

    patch_entry(monkeypatch, REWARD_COMPONENTS, "target", emits_target)
    trainer.cfg.reward.weights = {"target": 1.0}
    curve = [trainer.step()[0]["reward/mean"] for _ in range(12)]
    start, end = sum(curve[:3]) / 3, sum(curve[-3:]) / 3
    assert end > start + 0.4 and end > 0.6, curve


@pytest.mark.slow
def test_default_model_trains_one_step_and_saves(tmp_path):
    """The real SmolLM2-135M-Instruct: conversion (cached), one GRPO step, a loadable checkpoint."""
    assert main(["train", "configs/default.yaml", f"trainer.output_dir={tmp_path}",
                 "trainer.run_name=real", "trainer.progress=false", "trainer.steps=1",
                 "trainer.batch_size=8", "rollout.n=4", "rollout.max_new_tokens=24",
                 "data.arithmetic.val_size=8"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "real" / "metrics.jsonl").read_text().splitlines()]
    assert lines[1]["train/tokens"] > 0 and lines[1]["train/grad_norm"] >= 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "real" / "checkpoints" / "step_1" / "huggingface")
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


@pytest.mark.parametrize("overrides", [
    ["algo.advantage=grpo_no_std", "algo.loss_agg=sequence"],
    ["algo.advantage=raw", "rollout.n=1", "trainer.batch_size=4"],
    ["algo.beta=0.1", "algo.kl_estimator=k1", "algo.kl_in=reward"],
    ["algo.beta=0.1", "algo.kl_estimator=k3", "algo.kl_in=loss", "optim.schedule=cosine",
     "optim.warmup_ratio=0.5"],
])
def test_algorithm_variants_run_two_steps(tmp_path, overrides):
    cfg = load_config("configs/smoke.yaml", [f"trainer.output_dir={tmp_path}", "trainer.progress=false",
                                              "data.arithmetic.val_size=0", *overrides])
    trainer = Trainer(cfg)
    for _ in range(2):
        metrics = trainer.step()[0]
        assert all(v == v for v in metrics.values())  # no NaN anywhere
    if cfg.algo.beta > 0 and cfg.algo.kl_in == "reward":
        assert metrics["train/kl_in_reward"] >= -1e3 and "train/kl" in metrics
    if cfg.algo.beta > 0 and cfg.algo.kl_in == "loss":
        assert metrics["train/kl"] >= 0  # k3 is non-negative
