"""On-policy distillation end to end (teacher.path, docs/teachers.md): runs of configs/smoke.yaml
on the tiny model with a teacher of another seed saved as a model folder, in local and in ray
placement; the teacher is never synced, a teacher equal to the student changes nothing, a run
with a teacher stops and resumes bitwise, and a teacher with another tokenizer stops the command
at start-up in one line."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from helpers import (
    assert_metrics_close,
    metrics,
    smoke_cfg,
    stop_resume_and_compare,
)

from reasonrl.cli import main
from reasonrl.model.load import build_tiny_model
from reasonrl.train.trainer import Trainer, train
from reasonrl.weights import weights_checksum


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> str:
    """A tiny model of seed 1 (the student is seed 0's) as an HF folder."""
    folder = tmp_path_factory.mktemp("teacher") / "seed1"
    model, tokenizer = build_tiny_model(seed=1)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


class Recording:
    """A worker seen through the methods called on it."""

    def __init__(self, worker):
        self.worker, self.calls = worker, []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.worker, name)


def test_a_distillation_run_logs_the_teacher_stage_and_never_syncs_the_teacher(tmp_path, teacher_dir):
    """3 steps with the teacher's term added to GRPO's (task_weight 1): every step logs
    distill/reverse_kl (= the student's mean log-prob minus the teacher's, over the same tokens)
    and time/teacher; the trainer asks the teacher for log-probs only, its weights never change
    while the student's do; the report has its distillation panel."""
    cfg = smoke_cfg(tmp_path, "d", f"teacher.path={teacher_dir}", "tracking.report=true")
    trainer = Trainer(cfg)
    teacher = trainer.teacher
    sync = trainer.workers.sync  # its one destination: the rollout worker
    assert sync.rollout is sync.transport.rollout is trainer.rollout and sync.policy is trainer.policy
    before = teacher.weights_checksum(), trainer.policy.weights_checksum()
    trainer.teacher = spy = Recording(teacher)
    try:
        trainer.fit()
        after = teacher.weights_checksum(), trainer.policy.weights_checksum()
    finally:
        trainer.workers.close()
    assert set(spy.calls) == {"logprobs"} and len(spy.calls) == 3  # one forward per step, nothing else
    assert after[0] == before[0] == weights_checksum(build_tiny_model(seed=1)[0].named_parameters())
    assert after[1] != before[1]
    rows = [json.loads(x) for x in (tmp_path / "d" / "metrics.jsonl").read_text().splitlines()]
    for row in rows[1:]:
        # the mean of differences against the difference of two float32 means of ~-11 over ~100
        # tokens: each rounds by at most 100 x 11 x 2^-24 = 7e-5 (measured 1.6e-6)
        assert row["distill/reverse_kl"] == pytest.approx(
            row["distill/student_logprob"] - row["distill/teacher_logprob"], abs=1.4e-4)
        assert row["distill/teacher_logprob"] < 0 and 0 <= row["distill/teacher_prefers"] <= 1
        assert row["time/teacher"] > 0
    report = (tmp_path / "d" / "report.html").read_text()
    assert 'id="distill"' in report and 'id="plot-distill_reverse_kl"' in report


def test_a_teacher_that_is_the_student_leaves_the_student_unchanged(tmp_path):
    """teacher.path=tiny is the student's own model (seed 0): with the task's advantage off every
    token's advantage is exactly 0, so is the gradient, and AdamW leaves every weight as it was."""
    trainer = Trainer(smoke_cfg(tmp_path, "same", "teacher.path=tiny", "teacher.task_weight=0"))
    try:
        before = {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters()}
        found, batch, advantages = trainer.step()
        assert advantages.dim() == 2 and torch.count_nonzero(advantages) == 0
        assert found["distill/reverse_kl"] == 0.0 and found["train/grad_norm"] == 0.0
        assert all(torch.equal(p.detach(), before[n]) for n, p in trainer.policy.model.named_parameters())
    finally:
        trainer.workers.close()
        trainer.run.release()


def test_a_run_with_a_teacher_stops_and_resumes_bitwise(tmp_path, teacher_dir):
    """Distillation alone: 2 steps, SIGINT, resume, 2 more end bitwise where 4 straight steps end
    (weights, every metric, the samples): the teacher holds no state besides its fixed weights."""
    overrides = (f"teacher.path={teacher_dir}", "teacher.task_weight=0", "teacher.coef=0.5")
    stop_resume_and_compare(tmp_path, *overrides)
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "distill/reverse_kl" in r] == [1, 2, 3, 4]


def test_a_teacher_with_another_tokenizer_stops_the_command_before_any_model_loads(tmp_path, capsys, tiny):
    model, tokenizer = tiny
    folder = tmp_path / "other_vocab"
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<|teacher_only|>"])
    model.config.save_pretrained(folder)  # the check reads the tokenizer and config.json alone
    other.save_pretrained(folder)
    code = main(["train", "configs/smoke.yaml", f"trainer.output_dir={tmp_path}", "trainer.run_name=x",
                 f"teacher.path={folder}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith(f"reasonrl: config error: teacher.path={folder}: its tokenizer is not the student")
    assert "'<|teacher_only|>' (id 49152) is not in the student's" in err
    assert not (tmp_path / "x").exists()


def test_an_evaluation_of_a_distillation_config_neither_loads_nor_needs_its_teacher(tmp_path, capsys):
    """`reasonrl eval` with a config whose teacher is gone (a moved folder): the evaluation samples
    and scores the policy alone, so the teacher is dropped before the preflight."""
    code = main(["eval", "--config", "configs/smoke.yaml", f"teacher.path={tmp_path / 'gone'}", "--limit",
                 "2", "--greedy", "--no-progress", "--no-entropy"])
    assert code == 0, capsys.readouterr().err


def test_ray_mode_distills_as_local_mode_does(ray_session, tmp_path, teacher_dir):
    """The teacher in a Ray actor of its own (placement.teacher), the policy and the rollout in
    theirs: the same 2 steps' metrics as local mode's (rel 1e-6; measured equal)."""
    overrides = (f"teacher.path={teacher_dir}", "trainer.steps=2")
    train(smoke_cfg(tmp_path, "local", *overrides))
    train(smoke_cfg(tmp_path, "ray", *overrides, "placement.mode=ray"))
    ray_rows, local_rows = metrics(tmp_path / "ray"), metrics(tmp_path / "local")
    assert all("distill/reverse_kl" in r for r in ray_rows[1:])
    assert_metrics_close(ray_rows, local_rows, rel=1e-6)
