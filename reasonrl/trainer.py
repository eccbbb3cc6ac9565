"""The single controller. It holds no model: it moves batches between the workers.

One step, top to bottom (`Trainer.step`):
    prompts -> rollout (G samples each) -> rewards -> advantages -> policy update -> sync
then metrics, samples, held-out eval and checkpoints.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from reasonrl.algo import group_advantages, kl_penalised_rewards, zero_variance_groups
from reasonrl.batch import Example, Rollouts, Scores, TrainBatch
from reasonrl.config import Config, dump_yaml
from reasonrl.data import PromptSampler, load_examples
from reasonrl.placement import build_workers
from reasonrl.rewards import score_rollouts
from reasonrl.rollout import SamplingParams
from reasonrl.tracking import Tracker

EVAL_CHUNK = 64  # prompts per generate call during evaluation


@dataclass
class RunResult:
    run_dir: Path
    eval_before: dict[str, float]
    eval_after: dict[str, float]
    last_metrics: dict[str, float]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_run_dir(cfg: Config) -> Path:
    name = cfg.trainer.run_name or datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(cfg.trainer.output_dir) / name
    if (run_dir / "metrics.jsonl").exists():
        raise FileExistsError(f"{run_dir} already holds a run; choose another trainer.run_name")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_yaml(cfg))
    return run_dir


def rollout_metrics(rollouts: Rollouts, scores: Scores, advantages: torch.Tensor,
                    seconds: float) -> dict[str, float]:
    lengths = rollouts.completion_lengths
    metrics = {
        "reward/mean": scores.total.mean().item(),
        "reward/std": scores.total.std().item() if len(scores.total) > 1 else 0.0,
        "reward/errors": float(scores.errors),
        "reward/zero_std_groups": float(zero_variance_groups(scores.total, rollouts.group)),
        "advantage/mean": advantages.mean().item(),
        "advantage/std": advantages.std().item() if len(advantages) > 1 else 0.0,
        "advantage/min": advantages.min().item(),
        "advantage/max": advantages.max().item(),
        "rollout/response_length_mean": lengths.mean().item(),
        "rollout/response_length_max": lengths.max().item(),
        "rollout/truncated_frac": rollouts.truncated.float().mean().item(),
        "rollout/tokens_per_s": lengths.sum().item() / max(seconds, 1e-9),
    }
    for name, values in scores.components.items():
        metrics[f"reward/{name}"] = values.mean().item()
    if "correct" in scores.components:
        metrics["reward/accuracy"] = scores.components["correct"].mean().item()
    return metrics


def atomic_save(target: Path, write) -> None:
    """Write a folder via `write(tmp)` then rename: a checkpoint is complete or absent."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        for root, _, files in os.walk(tmp):
            for f in files:
                with open(Path(root) / f, "rb") as fh:
                    os.fsync(fh.fileno())
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


class Trainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        torch.set_num_threads(cfg.trainer.threads or os.cpu_count() or 1)
        self.train_examples, self.held_out = load_examples(cfg.data, cfg.trainer.seed)
        self.workers = build_workers(cfg)
        # Seed after loading: a first-run model conversion draws random numbers (weight
        # init before the GGUF weights are copied in); the run must not depend on the cache.
        seed_everything(cfg.trainer.seed)
        self.policy, self.rollout = self.workers.policy, self.workers.rollout
        for example in self.train_examples[:1000] + self.held_out:  # fail now, not at step 500
            self.rollout.encode(example)
        self.sampler = PromptSampler(self.train_examples, cfg.trainer.seed, cfg.data.shuffle)
        r = cfg.rollout
        self.sampling = SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p,
                                       top_k=r.top_k, max_new_tokens=r.max_new_tokens)
        self.eval_sampling = SamplingParams(
            n=1, greedy=True, max_new_tokens=r.eval_max_new_tokens or r.max_new_tokens)
        self.step_count = 0

    # ---- one training step -----------------------------------------------------------

    def step(self) -> tuple[dict[str, float], Rollouts, Scores, torch.Tensor]:
        cfg, times = self.cfg, {}
        t0 = time.perf_counter()
        examples = self.sampler.next(cfg.trainer.batch_size // cfg.rollout.n)

        rollouts = self.rollout.rollout(examples, self.sampling)
        times["rollout"] = time.perf_counter() - t0

        t = time.perf_counter()
        scores = score_rollouts(rollouts.texts, [e.ground_truth for e in rollouts.examples],
                                cfg.reward.weights, cfg.reward.fallback_last_number)
        rewards = scores.total
        kl_metrics = {}
        if cfg.algo.beta > 0 and cfg.algo.kl_in == "reward":
            seq_kl = self.policy.sequence_kl(rollouts.prompt_ids, rollouts.completion_ids)
            rewards = kl_penalised_rewards(rewards, seq_kl, torch.ones_like(seq_kl), cfg.algo.beta)
            kl_metrics = {"train/kl_in_reward": seq_kl.mean().item()}
        times["reward"] = time.perf_counter() - t

        advantages = group_advantages(rewards, rollouts.group, cfg.algo.advantage, cfg.algo.std_eps)

        t = time.perf_counter()
        update = self.policy.train_step(TrainBatch(rollouts.prompt_ids, rollouts.completion_ids,
                                                   advantages))
        times["update"] = time.perf_counter() - t

        t = time.perf_counter()
        self.rollout.load_weights(self.policy.named_weights())
        times["sync"] = time.perf_counter() - t
        times["step"] = time.perf_counter() - t0

        self.step_count += 1
        metrics = rollout_metrics(rollouts, scores, advantages, times["rollout"])
        metrics.update(update)
        metrics.update(kl_metrics)
        metrics.update({f"time/{k}": v for k, v in times.items()})
        return metrics, rollouts, scores, advantages

    # ---- evaluation -------------------------------------------------------------------

    def evaluate(self, examples: list[Example] | None = None) -> dict[str, float]:
        """Greedy decoding on the held-out set: accuracy (the `correct` component) and reward."""
        examples = self.held_out if examples is None else examples
        if not examples:
            return {}
        t = time.perf_counter()
        totals, correct, truncated, lengths = [], [], [], []
        for start in range(0, len(examples), EVAL_CHUNK):
            chunk = examples[start: start + EVAL_CHUNK]
            rollouts = self.rollout.rollout(chunk, self.eval_sampling)
            # `correct` is always scored (weight 0 if the config does not use it).
            scores = score_rollouts(rollouts.texts, [e.ground_truth for e in chunk],
                                    {"correct": 0.0, **self.cfg.reward.weights},
                                    self.cfg.reward.fallback_last_number)
            totals.append(scores.total)
            correct.append(scores.components["correct"])
            truncated.append(rollouts.truncated.float())
            lengths.append(rollouts.completion_lengths)
        return {
            "eval/accuracy": torch.cat(correct).mean().item(),
            "eval/reward_mean": torch.cat(totals).mean().item(),
            "eval/truncated_frac": torch.cat(truncated).mean().item(),
            "eval/response_length_mean": torch.cat(lengths).mean().item(),
            "eval/num_examples": float(len(examples)),
            "time/eval": time.perf_counter() - t,
        }

    # ---- outputs ----------------------------------------------------------------------

    def save_checkpoint(self, run_dir: Path) -> Path:
        target = run_dir / "checkpoints" / f"step_{self.step_count}"

        def write(tmp: Path) -> None:
            self.policy.save_pretrained(tmp / "huggingface", self.workers.tokenizer)
            (tmp / "trainer_state.json").write_text(json.dumps({
                "step": self.step_count, "sampler": self.sampler.state_dict()}))

        atomic_save(target, write)
        return target

    def sample_rows(self, rollouts: Rollouts, scores: Scores, advantages: torch.Tensor) -> list[dict]:
        rows = []
        # One completion from each of the first few groups shows more variety than one group.
        picks = [int(i) for i in torch.nonzero(
            torch.arange(len(rollouts)) % self.cfg.rollout.n == 0).flatten()]
        for i in picks[: self.cfg.trainer.log_samples]:
            e = rollouts.examples[i]
            rows.append({"prompt": e.prompt, "ground_truth": e.ground_truth,
                         "completion": rollouts.texts[i], "reward": scores.total[i].item(),
                         "components": {k: v[i].item() for k, v in scores.components.items()},
                         "advantage": advantages[i].item(),
                         "truncated": bool(rollouts.truncated[i])})
        return rows

    # ---- the loop ---------------------------------------------------------------------

    def fit(self) -> RunResult:
        cfg = self.cfg
        run_dir = make_run_dir(cfg)
        print(f"[reasonrl] run directory: {run_dir}", flush=True)
        eval_before = self.evaluate()
        if eval_before:
            print(f"[reasonrl] held-out accuracy before training: {eval_before['eval/accuracy']:.3f} "
                  f"({int(eval_before['eval/num_examples'])} problems, greedy)", flush=True)
        tracker = Tracker(run_dir, cfg.trainer.steps, cfg.trainer.progress)
        if eval_before:
            tracker.log(0, eval_before)
        metrics: dict[str, float] = {}
        eval_after = eval_before
        try:
            while self.step_count < cfg.trainer.steps:
                metrics, rollouts, scores, advantages = self.step()
                step = self.step_count
                last = step == cfg.trainer.steps
                if (cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0) or last:
                    eval_after = self.evaluate()
                    metrics.update(eval_after)
                tracker.log(step, metrics)
                tracker.samples(step, self.sample_rows(rollouts, scores, advantages))
                tracker.progress(metrics)
                if (cfg.trainer.save_every and step % cfg.trainer.save_every == 0) or last:
                    self.save_checkpoint(run_dir)
        finally:
            tracker.close()
        summary = {"steps": self.step_count, "eval_before": eval_before, "eval_after": eval_after}
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        if eval_before:
            print(f"[reasonrl] held-out accuracy: {eval_before['eval/accuracy']:.3f} before -> "
                  f"{eval_after['eval/accuracy']:.3f} after {self.step_count} steps", flush=True)
        print(f"[reasonrl] wrote {run_dir}/ (config.yaml, metrics.jsonl, samples.jsonl, "
              f"checkpoints/step_{self.step_count}/huggingface)", flush=True)
        return RunResult(run_dir, eval_before, eval_after, metrics)


def train(cfg: Config) -> RunResult:
    return Trainer(cfg).fit()
