"""`reasonrl sft` end to end on the tiny model (`reasonrl.sft.trainer`): exact resume, the loss it
logs, RL and the probe from its checkpoint, LoRA, bad input and the run directory's rules.
Nothing here depends on what the tiny model samples: the checks are equalities between two
computations of the same thing, or bounds on float32 rounding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import HAS_PEFT, assert_same_run, interrupt_after, keep_torch_threads, smoke_cfg  # noqa: F401
from safetensors.torch import load_file

from reasonrl.cli import main
from reasonrl.config import load_config
from reasonrl.errors import ConfigError, TrainingInterrupted
from reasonrl.sft.trainer import SFTTrainer, sft
from reasonrl.train.trainer import Trainer

REPO = Path(__file__).parents[2]
CHAT = [{"role": "user", "content": "What is 347 * 29?"},
        {"role": "assistant", "content": "<calculator>347 * 29</calculator>"},
        {"role": "tool", "content": "10063"},
        {"role": "assistant", "content": "The answer is 10063."}]


def sft_cfg(out: Path, name: str, *overrides: str):
    """The arithmetic task's problems with solver-written solutions (32 train, 4 held out), 8
    records a step, on the tiny model."""
    return load_config(None, [
        "model.path=tiny", "sft.source=solver", "data.arithmetic.train_size=32", "data.arithmetic.val_size=4",
        "trainer.batch_size=8", "trainer.steps=4", "trainer.threads=1", "trainer.progress=false",
        "tracking.report=false", "rollout.max_new_tokens=8", "optim.lr=1e-3", f"trainer.output_dir={out}",
        f"trainer.run_name={name}", *overrides])


def rows(run: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


@pytest.mark.parametrize("lora", ["", "model.lora.rank=4"], ids=["full", "lora"])
def test_stop_and_resume_is_bitwise_the_straight_run(tmp_path, lora):
    """4 straight steps against 2, SIGINT (the step finishes and saves), then a resume to 4:
    the same weights, metrics (held-out evals at steps 2 and 4 included) and logged records."""
    if lora and not HAS_PEFT:
        pytest.skip("peft is not installed (pip install 'reasonrl[lora]')")
    both = [*filter(None, [lora]), "trainer.eval_every=2"]
    sft(sft_cfg(tmp_path, "straight", *both))
    trainer = SFTTrainer(sft_cfg(tmp_path, "r", *both, "trainer.save_every=2", "trainer.keep_last=0"))
    interrupt_after(trainer, 2)
    with pytest.raises(TrainingInterrupted):
        trainer.fit()
    trainer.workers.close()
    assert json.loads((tmp_path / "r/checkpoints/step_2/trainer_state.json").read_text())["kind"] == "sft"
    sft(sft_cfg(tmp_path, "r", *both, "trainer.resume=auto", "trainer.save_every=2", "trainer.keep_last=0"))
    assert_same_run(tmp_path / "r", tmp_path / "straight")
    if lora:  # the adapter is what a resume loads; huggingface/ holds the merged weights RL starts from
        assert (tmp_path / "r/checkpoints/step_4/adapter").is_dir()
    metrics = rows(tmp_path / "straight")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4] and "eval/loss" in metrics[2]


def test_the_first_steps_loss_is_the_held_out_loss_of_the_same_records(tmp_path):
    """Train and held-out records the same file (a pair and a tool-call conversation, as JSONL),
    one step over all of them: the step's loss (the forward before its update) is the held-out
    loss measured before training, the same token mean in other micro-batches (float32 sums of
    ~60 terms in another order: relative 1e-5), over the same trained tokens."""
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"prompt": "What is 2 + 3?", "completion": "The answer is 5."}) + "\n"
                    + json.dumps({"messages": CHAT}) + "\n")
    result = sft(sft_cfg(tmp_path, "same", "sft.source=files", f"sft.train_path={data}",
                         f"sft.val_path={data}", "trainer.batch_size=4", "trainer.steps=1",
                         "optim.micro_batch_size=1"))
    before, step = rows(result.run_dir)[:2]
    assert step["sft/loss"] == pytest.approx(before["eval/loss"], rel=1e-5)
    assert step["sft/tokens"] == 2 * before["eval/loss_tokens"]  # 4 records a step: both twice
    logged = {r["where"]: r for r in rows(result.run_dir, "samples.jsonl")}
    assert logged[f"{data}:2"]["trained"] == ("<calculator>347 * 29</calculator><|im_end|>"
                                              "The answer is 10063.<|im_end|>")
    assert logged[f"{data}:1"]["trained"] == "The answer is 5.<|im_end|>"
    assert "eval/accuracy" in before  # generate_eval: the arithmetic task's held-out problems, generated


def test_the_micro_batch_split_changes_neither_loss_nor_gradient(tmp_path):
    """The loss is normalised by the step's trained tokens: one record per micro-batch or all in
    one give the same loss and gradient norm (float32 sums in another order)."""
    once = ("trainer.steps=1", "sft.generate_eval=false")
    one = sft(sft_cfg(tmp_path, "one", "optim.micro_batch_size=1", *once))
    all_ = sft(sft_cfg(tmp_path, "all", "optim.micro_batch_size=8", *once))
    a, b = rows(one.run_dir)[-1], rows(all_.run_dir)[-1]
    assert a["train/micro_batches"] == 8 and b["train/micro_batches"] == 1
    assert a["sft/loss"] == pytest.approx(b["sft/loss"], rel=1e-5)
    assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4)


def test_rl_starts_from_the_sft_checkpoint_and_the_probe_reads_it(tmp_path, capsys):
    """1 SFT step, then 1 RL step with model.path=<its checkpoint>: the RL policy starts from
    exactly the SFT run's weights, its held-out generations are the SFT run's last (the same
    greedy eval of the same weights: the same lengths), and the step trains; `reasonrl probe
    --model <checkpoint>` runs on it."""
    result = sft(sft_cfg(tmp_path, "s", "trainer.steps=1"))
    checkpoint = result.run_dir / "checkpoints" / "step_1"
    sft_weights = load_file(checkpoint / "huggingface" / "model.safetensors")
    trainer = Trainer(smoke_cfg(tmp_path, "rl", f"model.path={checkpoint}", "trainer.steps=1",
                                "data.arithmetic.val_size=4", "rollout.max_new_tokens=8"))
    start = trainer.policy.model.state_dict()
    assert all(torch.equal(start[k], sft_weights[k]) for k in sft_weights)
    rl = trainer.fit()
    trainer.workers.close()
    for key in ("eval/response_length_mean", "eval/response_length_p95", "eval/truncated_frac"):
        assert rl.eval_before[key] == result.eval_after[key], key
    after = load_file(rl.run_dir / "checkpoints" / "step_1" / "huggingface" / "model.safetensors")
    assert any(not torch.equal(after[k], sft_weights[k]) for k in after)  # the RL step moved them
    capsys.readouterr()
    code = main(["probe", "--config", str(REPO / "configs" / "smoke.yaml"), "--model", str(checkpoint),
                 "--limit", "2", "--n", "2", "--max-new-tokens", "4", "--no-progress", "--no-entropy"])
    assert code == 0 and "verdict" in capsys.readouterr().out.lower()


def test_epochs_count_the_steps_and_a_finished_run_says_so(tmp_path, capsys):
    result = sft(sft_cfg(tmp_path, "e", "trainer.epochs=0.5", "sft.generate_eval=false"))  # 16 of 32 records
    assert [m["step"] for m in rows(result.run_dir)] == [0, 1, 2]
    capsys.readouterr()
    again = sft(sft_cfg(tmp_path, "e", "trainer.epochs=0.5", "sft.generate_eval=false",
                        "trainer.resume=auto"))
    out = capsys.readouterr().out
    assert "is finished: its checkpoint step_2 is at step 2 of trainer.steps=2, nothing to train" in out
    assert again.eval_after == result.eval_after


def test_a_bad_record_stops_the_command_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"prompt": "q", "completion": "a"}\n{"prompt": "q"}\n')
    code = main(["sft", "sft.train_path=bad.jsonl", "model.path=tiny", "trainer.run_name=b"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["reasonrl: error: bad.jsonl:2: missing field 'completion' (an SFT record "
                                 "has 'prompt' and 'completion', or 'messages'); the record has prompt"]
    assert not (tmp_path / "runs" / "b").exists()  # refused before any model loaded or folder was made


def test_what_sft_refuses_at_start(tmp_path):
    with pytest.raises(ConfigError, match="sft.train_path: empty"):
        SFTTrainer(sft_cfg(tmp_path, "x", "sft.source=files"))
    with pytest.raises(ConfigError, match="placement.mode=ray: reasonrl sft runs its workers in this"):
        SFTTrainer(sft_cfg(tmp_path, "x", "placement.mode=ray"))
    with pytest.raises(ConfigError, match="sft.source=solver: no solver for .* data.task=piecewise"):
        SFTTrainer(sft_cfg(tmp_path, "x", "data.task=piecewise"))
    Trainer(smoke_cfg(tmp_path, "rl", "trainer.steps=1")).fit()
    with pytest.raises(ConfigError, match="is a checkpoint of `reasonrl train`, not of an SFT run"):
        SFTTrainer(sft_cfg(tmp_path, "rl", f"trainer.resume={tmp_path / 'rl'}"))
