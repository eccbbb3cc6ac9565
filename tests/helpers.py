"""Helpers shared by several test modules."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from reasonrl.algo import LossSettings, ValueLossSettings
from reasonrl.batch import Rollouts
from reasonrl.config import AlgoConfig, CriticConfig, OptimConfig, load_config
from reasonrl.learn.learner import LAYOUT_METRICS
from reasonrl.model.forward import make_micro_batches
from reasonrl.workers.policy import PolicySettings

# |engine - policy| log-probs: the float rounding of two kernels (~1e-7), which another layout
# (ranks, actors) rounds otherwise; nothing else of the run depends on it
ROUNDING_METRICS = ("logprob_diff_mean", "logprob_diff_max")

# LoRA needs the `lora` extra (peft; in `dev`, absent from `make test-bare`)
HAS_PEFT = importlib.util.find_spec("peft") is not None
needs_peft = pytest.mark.skipif(not HAS_PEFT, reason="peft is not installed (pip install 'reasonrl[lora]')")

_ALGO = {f.name for f in dataclasses.fields(AlgoConfig)}
_OPTIM = {f.name for f in dataclasses.fields(OptimConfig)}


def grouped_rows(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Three prompts (5, 8, 11 tokens) with two completions each, lengths 1-9: groups that share a
    prompt, and padding inside micro-batches."""
    rng = random.Random(seed)
    prompt_ids, completion_ids = [], []
    for i in range(3):
        p = [rng.randrange(100, 2000) for _ in range(5 + 3 * i)]
        for _ in range(2):
            prompt_ids.append(p)
            completion_ids.append([rng.randrange(100, 2000) for _ in range(rng.randint(1, 9))])
    return prompt_ids, completion_ids


def policy_settings(**values) -> PolicySettings:
    """`PolicySettings` from flat keyword arguments, each routed to the section that has it
    (`lr=0.1` -> optim.lr, `beta=0.1` -> algo.beta, `temperature=0.7` -> the settings)."""
    algo = {k: v for k, v in values.items() if k in _ALGO}
    optim = {k: v for k, v in values.items() if k in _OPTIM}
    rest = {k: v for k, v in values.items() if k not in _ALGO | _OPTIM}
    if "betas" in optim:
        optim["betas"] = list(optim["betas"])
    return PolicySettings(algo=AlgoConfig(**algo), optim=OptimConfig(**optim), **rest)


def loss_settings(**changes) -> LossSettings:
    """The `algo` section's defaults as the losses read them, with `changes` (each an `algo` key)."""
    return LossSettings.of(AlgoConfig(), **changes)


def value_loss_settings(**changes) -> ValueLossSettings:
    """The `critic` section's defaults as the value losses read them, with `changes`."""
    return ValueLossSettings.of(CriticConfig(), **changes)


def score_recipe_cases(recipe: Path, cases: list[tuple], data_source: str = "gsm8k"):
    """The `Scores` of a differential table's rows (name, completion, ground truth, expected)
    through the recipe's own reward config, the path a run takes (reward workers included)."""
    from reasonrl.batch import Example
    from reasonrl.rewards import score_examples

    cfg = load_config(recipe, ["reward.timeout=120"]).reward
    examples = [Example(prompt="", ground_truth=truth, data_source=data_source) for _, _, truth, _ in cases]
    return score_examples([completion for _, completion, _, _ in cases], examples, cfg)


def patch_entry(monkeypatch, registry, name: str, fn, **fields) -> None:
    """Select `fn` by `name` in `registry` for one test (undone by monkeypatch). `fields`: the
    entry's fields (the registry's `kind`); those not given are the replaced entry's, if any
    (`dataclasses.replace`)."""
    import dataclasses

    registry.names()  # fill it first, so the patch is not overwritten by the first lookup
    if name in registry:
        entry = dataclasses.replace(registry[name], fn=fn, **fields)
    else:
        entry = registry.entry(name, fn, **fields)
    monkeypatch.setitem(registry._entries, name, entry)


def spy_on(engine):
    """Record every id the engine samples, per generate call and row."""
    sampled: list[list[list[int]]] = []
    generate = engine.generate

    def recording(prompt_ids, params, seeds=None):
        gen = generate(prompt_ids, params, seeds)
        sampled.append([list(ids) for ids in gen.completion_ids])
        engine.sampled_logprobs.append(gen.logprobs)
        return gen
    engine.sampled_logprobs = []  # per call: the engine's log-probs of each row (None: none reported)
    engine.generate = recording
    return sampled


class ScriptedEngine:
    """An engine whose call k of `generate` answers `script[k]`: one text per row (the prompts'
    n rows, prompt-major). A text is tokenized; the row ends (not truncated) at EOS or a stop
    string it ends with, and is cut (truncated) at `max_new_tokens`. `calls` records each
    call's (prompt ids, params, seeds), `sampled` each call's rows of ids."""

    def __init__(self, tokenizer, script: list[list[str]], logprobs: bool = False):
        self.tokenizer, self.script, self.logprobs = tokenizer, script, logprobs
        self.calls: list[tuple] = []
        self.sampled: list[list[list[int]]] = []
        self.sessions = 0  # `session()` blocks entered

    def session(self):
        import contextlib

        self.sessions += 1
        return contextlib.nullcontext()

    def generate(self, prompt_ids, params, seeds=None):
        from reasonrl.rollout import Generation

        texts = self.script[len(self.calls)]
        assert len(texts) == len(prompt_ids) * params.n, (len(texts), len(prompt_ids), params.n)
        self.calls.append((prompt_ids, params, seeds))
        rows, cut = [], []
        for text in texts:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            ended = ids[-1] == self.tokenizer.eos_token_id or any(text.endswith(s) for s in params.stop)
            rows.append(ids[: params.max_new_tokens])
            cut.append(len(ids) > params.max_new_tokens or not ended)
        self.sampled.append(rows)
        # with `logprobs`: -0.5, -1.5, ... per token, a sampler's log-probs of a fixed shape
        logp = [-0.5 - torch.arange(len(r), dtype=torch.float32) for r in rows] if self.logprobs else None
        return Generation(rows, cut, logp)


def check_token_in_token_out(r: Rollouts, sampled: list[list[list[int]]], tokenizer, pad_id: int) -> None:
    """Each row's completion is its sampled turns (exactly the engine's ids; a turn cut by a
    limit is a prefix of them) with the environment's ids between them; the mask is 1 exactly
    on the sampled ids; the policy's micro-batches train on those ids with that mask. Call t of
    the engine sampled, in row order, the rows that had more than t turns."""
    assert max(r.episodes.num_turns.tolist()) >= 2  # really multi-turn
    for k in range(len(r)):
        ids, mask = r.completion_ids[k], r.token_mask[k]
        assert len(mask) == len(ids) and set(mask) <= {0, 1}
        runs, start = [], 0  # maximal runs of model (1) and environment (0) ids
        for t in range(1, len(ids) + 1):
            if t == len(ids) or mask[t] != mask[start]:
                runs.append((mask[start], ids[start:t]))
                start = t
        model_runs = [run for bit, run in runs if bit == 1]
        assert len(model_runs) == int(r.episodes.num_turns[k])
        for turn, run in enumerate(model_runs):
            j = sum(1 for i in range(k) if int(r.episodes.num_turns[i]) > turn)  # its row in that engine call
            sample = sampled[turn][j]
            assert run == sample[: len(run)], f"row {k} turn {turn}: not the ids the engine sampled"
            assert len(run) == len(sample) or (turn == len(model_runs) - 1 and bool(r.truncated[k]))
        for bit, run in runs:
            if bit == 0:  # environment ids are an observation's tokenization
                assert run == tokenizer(tokenizer.decode(run), add_special_tokens=False)["input_ids"]
    for size, share in [(1, False), (3, True)]:
        for mb in make_micro_batches(r.prompt_ids, r.completion_ids, size, pad_id, share, r.token_mask):
            for j, i in enumerate(mb.rows):
                n = len(r.completion_ids[i])
                assert mb.targets[j, :n].tolist() == r.completion_ids[i]
                assert mb.mask[j, :n].tolist() == [float(b) for b in r.token_mask[i]]
                assert mb.mask[j, n:].sum() == 0


# ---- runs of configs/smoke.yaml compared across placements (test_scaling, test_placement) ----

REPO = Path(__file__).parent.parent
TRAINS = [f"reward.fn={REPO / 'tests' / 'fixtures' / 'length_reward.py'}:length",
          "reward.isolate_fn=false", "optim.lr=1e-3"]


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """The runs set torch's thread count (trainer.threads=1); later tests get it back. Autouse
    in every module that imports it."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def smoke_cfg(out: Path, name: str, *overrides: str):
    return load_config(REPO / "configs" / "smoke.yaml", [
        f"trainer.output_dir={out}", f"trainer.run_name={name}", "trainer.progress=false",
        "trainer.steps=3", "trainer.threads=1", "tracking.report=false", *TRAINS, *overrides])


def metrics(run: Path) -> list[dict]:
    """A run's metrics that two placements of the same run share: not the times, the memory,
    nor how the rows were laid out in micro-batches (a rank's, or an actor's plain layout)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items()
             if not k.startswith(("time/", "mem/")) and k != "rollout/tokens_per_s"
             and k.split("/")[-1] not in LAYOUT_METRICS + ROUNDING_METRICS} for r in rows]


# 1 - Var(R - V) / Var(R) near 0 cancels: its absolute error is the ratio's relative error,
# ~1e-5 when the values are float32 sums in another order
ABS_TOL = {"critic/explained_variance": 1e-5}


def assert_metrics_close(a: list[dict], b: list[dict], rel: float) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for k in ra:
            tol = ABS_TOL.get(k, 1e-7) if rel > 1e-6 else 1e-7
            assert ra[k] == pytest.approx(rb[k], rel=rel, abs=tol), f"step {ra['step']}: {k}"


def interrupt_after(trainer, step: int = 2) -> None:
    """SIGINT this process once `trainer` has finished step `step`: its handler lets the step
    finish and save a checkpoint, then `fit` raises TrainingInterrupted (Ctrl-C mid-run)."""
    run_step = trainer.step

    def stepping():
        out = run_step()
        if trainer.step_count == step:
            os.kill(os.getpid(), signal.SIGINT)
        return out

    trainer.step = stepping


# ---- 4-step runs stopped and resumed, compared bitwise with an uninterrupted one ---------------
# (test_checkpoint, test_run_dir, test_failures)

RESUME_STEPS = 4
# a reward that varies within groups, so that every step changes weights and optimizer state
RESUME_TRAINS = [f"reward.fn={REPO / 'tests' / 'fixtures' / 'length_reward.py'}:length",
                 "reward.isolate_fn=false", "optim.lr=1e-4"]


def resume_cfg(out: Path, name: str, *overrides: str):
    return load_config(REPO / "configs" / "smoke.yaml", [
        f"trainer.output_dir={out}", f"trainer.run_name={name}", "trainer.progress=false",
        f"trainer.steps={RESUME_STEPS}", "trainer.threads=1", *RESUME_TRAINS, *overrides])


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"step_{RESUME_STEPS}" / "huggingface" / "model.safetensors")


def run_metrics(run: Path) -> list[dict]:
    """metrics.jsonl without wall-clock timings and GPU memory peaks (allowed to differ)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items()
             if not k.startswith(("time/", "mem/")) and k != "rollout/tokens_per_s"} for r in rows]


def assert_same_run(run: Path, reference: Path) -> None:
    a, b = final_weights(run), final_weights(reference)
    assert a.keys() == b.keys()
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff == 0.0, f"final weights differ by up to {diff}"
    assert run_metrics(run) == run_metrics(reference)
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert samples == [json.loads(x) for x in (reference / "samples.jsonl").read_text().splitlines()]


def stop_resume_and_compare(tmp_path, *overrides: str) -> None:
    """4 straight steps in runs/straight; in runs/r, SIGINT after step 2 (a checkpoint is
    saved), then a resume to step 4: the two runs must end bitwise alike (`assert_same_run`)."""
    from reasonrl.errors import TrainingInterrupted
    from reasonrl.train.trainer import Trainer

    Trainer(resume_cfg(tmp_path, "straight", *overrides)).fit()
    trainer = Trainer(resume_cfg(tmp_path, "r", *overrides, "trainer.save_every=2", "trainer.keep_last=0"))
    interrupt_after(trainer, 2)
    with pytest.raises(TrainingInterrupted):
        trainer.fit()
    Trainer(resume_cfg(tmp_path, "r", *overrides, "trainer.resume=auto", "trainer.save_every=2",
                      "trainer.keep_last=0")).fit()
    assert_same_run(tmp_path / "r", tmp_path / "straight")


STOPPABLE_CHILD = """
import sys, time
from pathlib import Path
from reasonrl.train import trainer as T
from reasonrl.cli import main

mode, marker = sys.argv[1], Path(sys.argv[2])
step, save = T.Trainer.step, T.Trainer.save_checkpoint

def slow_step(self):
    out = step(self)
    if mode == "term" and self.step_count == 2:  # wait here for the parent's SIGTERM
        marker.write_text("step 2")
        deadline = time.time() + 120
        while self.stop.requested is None and time.time() < deadline:
            time.sleep(0.05)
    return out

def slow_save(self, run_dir, *args, **kwargs):
    if mode == "kill" and self.step_count == 2:  # hang half-way through writing step_2
        write = self.policy.save_pretrained
        def hang(path, tokenizer=None):
            write(path, tokenizer)
            marker.write_text("writing step_2")
            time.sleep(120)
        self.policy.save_pretrained = hang
    return save(self, run_dir, *args, **kwargs)

T.Trainer.step, T.Trainer.save_checkpoint = slow_step, slow_save
sys.exit(main(["train", *sys.argv[3:]]))
"""


def run_child(tmp_path: Path, mode: str, sig: int, *overrides: str,
              during=None) -> subprocess.CompletedProcess:
    """A training child stopped by `sig` where `mode` makes it wait (after step 2 for "term",
    half-way through writing step_2 for "kill"); `during(pid)` runs while it waits."""
    marker = tmp_path / "marker"
    args = ["configs/smoke.yaml", f"trainer.output_dir={tmp_path}", "trainer.run_name=r",
            "trainer.progress=false", f"trainer.steps={RESUME_STEPS}", "trainer.threads=1", *RESUME_TRAINS,
            *overrides]
    proc = subprocess.Popen([sys.executable, "-c", STOPPABLE_CHILD, mode, str(marker), *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate(timeout=5)
    try:
        if during is not None:
            during(proc.pid)
    finally:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


class Prompts:
    """A prompt sampler (`collect_batch`'s `next(count)`) dealing the same examples from the
    first, every time."""

    def __init__(self, examples):
        self.examples = examples

    def next(self, count):
        return [self.examples[i % len(self.examples)] for i in range(count)]
