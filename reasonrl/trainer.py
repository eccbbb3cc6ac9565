"""The single controller. It holds no model: it moves batches between the workers.

One step, top to bottom (`Trainer.step`):
    prompts -> rollout (G samples each) -> rewards -> advantages -> policy update -> sync
then metrics, samples, held-out eval and checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from reasonrl.algo import (
    group_advantages,
    informative_groups,
    kl_penalised_rewards,
    overlong_penalty,
    zero_variance_groups,
)
from reasonrl.batch import Example, Rollouts, Scores, TrainBatch
from reasonrl.checkpoint import (
    TrainingAborted,
    TrainingInterrupted,
    atomic_save,  # noqa: F401  (re-exported: it lived here first)
    config_changes,
    config_hash,
    find_resume_point,
    list_checkpoints,
    read_checkpoint,
    remove_partial,
    rotate,
    set_rng_state,
    truncate_log,
    write_checkpoint,
)
from reasonrl.config import Config, ConfigError, dump_yaml, to_dict
from reasonrl.data import PromptSampler, load_examples
from reasonrl.placement import build_workers
from reasonrl.rewards import check_examples, score_rollouts
from reasonrl.rollout import SamplingParams, WeightSyncError
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


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def reset_gpu_peak() -> None:
    """Start a new peak for `gpu_memory_metrics` (nothing when this process uses no GPU)."""
    if _cuda_in_use():
        for i in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(i)


def gpu_memory_metrics() -> dict[str, float]:
    """`mem/` metrics: the peak GPU memory of this process since `reset_gpu_peak`, in GiB,
    summed over its GPUs (tensors allocated, and what PyTorch's caching allocator reserved).
    Empty when this process uses no GPU (a CPU run, or ray mode: the workers are elsewhere)."""
    if not _cuda_in_use():
        return {}
    count, gib = torch.cuda.device_count(), float(2 ** 30)
    return {"mem/gpu_peak_allocated_gib": sum(torch.cuda.max_memory_allocated(i) for i in range(count)) / gib,
            "mem/gpu_peak_reserved_gib": sum(torch.cuda.max_memory_reserved(i) for i in range(count)) / gib}


def make_run_dir(cfg: Config) -> Path:
    name = cfg.trainer.run_name or datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(cfg.trainer.output_dir) / name
    if (run_dir / "metrics.jsonl").exists():
        raise FileExistsError(f"{run_dir} already holds a run; choose another trainer.run_name")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_yaml(cfg))
    return run_dir


def rollout_metrics(rollouts: Rollouts, scores: Scores, advantages: torch.Tensor, seconds: float,
                    generated_tokens: float | None = None) -> dict[str, float]:
    """reward/, advantage/ and rollout/ metrics of the batch that is trained on.
    `generated_tokens` (default: this batch's) counts dropped resampled groups too."""
    lengths = rollouts.completion_lengths
    generated = lengths.sum().item() if generated_tokens is None else generated_tokens
    metrics = {
        "reward/mean": scores.total.mean().item(),
        "reward/std": scores.total.std().item() if len(scores.total) > 1 else 0.0,
        "reward/errors": float(scores.errors),
        "reward/timeouts": float(scores.timeouts),
        "reward/zero_std_groups": float(zero_variance_groups(scores.total, rollouts.group)),
        "advantage/mean": advantages.mean().item(),
        "advantage/std": advantages.std().item() if len(advantages) > 1 else 0.0,
        "advantage/min": advantages.min().item(),
        "advantage/max": advantages.max().item(),
        "rollout/response_length_mean": lengths.mean().item(),
        "rollout/response_length_max": lengths.max().item(),
        "rollout/truncated_frac": rollouts.truncated.float().mean().item(),
        "rollout/tokens_per_s": generated / max(seconds, 1e-9),
    }
    for name, values in scores.components.items():
        metrics[f"reward/{name}"] = values.mean().item()
    if "correct" in scores.components:
        # solved = full marks: partial credit (countdown's format score) is not accuracy
        metrics["reward/accuracy"] = (scores.components["correct"] >= 1.0).float().mean().item()
    return metrics


def take_rows(record, rows: list[int]):
    """The given rows of a per-completion record (`Rollouts`, `Scores`): every tensor, list
    and dict of tensors is indexed; other fields (counts) are kept."""
    values = {}
    for f in dataclasses.fields(record):
        v = getattr(record, f.name)
        if isinstance(v, torch.Tensor):
            values[f.name] = v[rows]
        elif isinstance(v, list):
            values[f.name] = [v[i] for i in rows]
        elif isinstance(v, dict):
            values[f.name] = {k: x[rows] for k, x in v.items()}
    return dataclasses.replace(record, **values)


def concat_records(records: list):
    """Rows of several records of one type, in order; counts add up (or merge as the field's
    metadata says), a None field stays None."""
    if len(records) == 1:
        return records[0]
    values = {}
    for f in dataclasses.fields(records[0]):
        vs = [getattr(r, f.name) for r in records]
        if any(v is None for v in vs):
            values[f.name] = None
        elif isinstance(vs[0], torch.Tensor):
            values[f.name] = torch.cat(vs)
        elif isinstance(vs[0], list):
            values[f.name] = [x for v in vs for x in v]
        elif isinstance(vs[0], dict):
            values[f.name] = {k: torch.cat([v[k] for v in vs]) for k in vs[0]}
        elif isinstance(vs[0], (int, float)):
            values[f.name] = f.metadata.get("merge", sum)(vs)
    return dataclasses.replace(records[0], **values)


def renumber_groups(group: torch.Tensor) -> torch.Tensor:
    """Group ids 0..k-1 in order of first appearance (after rows were dropped)."""
    ids: dict[int, int] = {}
    return torch.tensor([ids.setdefault(int(g), len(ids)) for g in group], dtype=torch.long)


class Trainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        torch.set_num_threads(cfg.trainer.threads or os.cpu_count() or 1)
        self.train_examples, self.held_out = load_examples(cfg.data, cfg.trainer.seed)
        check_examples(self.train_examples + self.held_out, cfg.reward)  # bad ground truth: fail now
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
        self.bad_steps = 0  # steps in a row with a non-finite loss or gradient
        self.stop_signal: str | None = None  # set by SIGINT/SIGTERM: stop after this step
        self.run_dir: Path | None = None
        self.resumed: dict | None = None  # the trainer_state of the checkpoint resumed from
        if cfg.trainer.resume:
            try:
                self.run_dir, checkpoint = find_resume_point(
                    cfg.trainer.resume, cfg.trainer.output_dir, cfg.trainer.run_name)
            except ValueError as err:
                raise ConfigError(str(err)) from err
            if checkpoint is not None:
                self.load_checkpoint(checkpoint)

    def load_checkpoint(self, path: Path) -> None:
        """Continue exactly where `path` stopped: weights, optimizer, scheduler, sampler,
        RNGs and step. Refuses a config that changed in keys not listed in
        `trainer.allow_config_change`."""
        state, tensors, weights = read_checkpoint(path)
        changes = config_changes(state["config"], to_dict(self.cfg))
        refused = {k: v for k, v in changes.items() if k not in self.cfg.trainer.allow_config_change}
        if refused:
            listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in refused.items())
            raise ConfigError(
                f"resuming {path}: the config changed ({listed}). Resume with the run's own "
                f"config, or accept the change with --allow-config-change {','.join(refused)}")
        self.policy.load_weights(weights)
        self.policy.load_state_dict(tensors["policy"])
        self.sampler.load_state_dict(state["sampler"])
        self.step_count, self.bad_steps = state["step"], state["bad_steps"]
        self.sync_weights()
        set_rng_state(tensors["rng"])
        self.resumed = {**state, "path": str(path)}

    # ---- one training step -----------------------------------------------------------

    def step(self) -> tuple[dict[str, float], Rollouts, Scores, torch.Tensor]:
        algo = self.cfg.algo
        reset_gpu_peak()
        t0 = time.perf_counter()
        # rollout + reward (with dynamic sampling: resample until the batch is informative)
        rollouts, scores, rewards, trainable, metrics, times = self.rollout_and_score()

        kl_metrics = {}
        if algo.beta > 0 and algo.kl_in == "reward":
            t = time.perf_counter()
            seq_kl = self.policy.sequence_kl(rollouts.prompt_ids, rollouts.completion_ids)
            # per completion: the [N] sums as [N, 1] "tokens" (a 1-D mask would sum over rows)
            rewards = kl_penalised_rewards(rewards, seq_kl[:, None], torch.ones(len(seq_kl), 1), algo.beta)
            kl_metrics = {"train/kl_in_reward": seq_kl.mean().item()}
            times["reward"] += time.perf_counter() - t

        if rollouts.policy_version != self.step_count:  # the update below assumes on-policy data
            raise WeightSyncError(f"step {self.step_count + 1}: rollouts came from policy version "
                                  f"{rollouts.policy_version}, expected {self.step_count}")
        advantages = group_advantages(rewards, rollouts.group, algo.advantage, algo.std_eps)
        loss_mask = trainable & ~rollouts.truncated if algo.mask_truncated else trainable

        t = time.perf_counter()
        update = self.policy.train_step(TrainBatch(rollouts.prompt_ids, rollouts.completion_ids,
                                                   advantages, loss_mask, rollouts.sampler_logprobs))
        times["update"] = time.perf_counter() - t
        self.step_count += 1  # the policy is now at version step_count

        t = time.perf_counter()
        self.sync_weights()
        times["sync"] = time.perf_counter() - t
        times["step"] = time.perf_counter() - t0

        metrics.update(rollout_metrics(rollouts, scores, advantages, times["rollout"],
                                       metrics.pop("rollout/generated_tokens")))
        metrics.update(update)
        metrics.update(kl_metrics)
        metrics.update({f"time/{k}": v for k, v in times.items()})
        metrics.update(gpu_memory_metrics())
        return metrics, rollouts, scores, advantages

    def sync_weights(self) -> None:
        """Push the policy's weights to the rollout engine and check, by checksum (and for
        engines that want it, the log-probs of a probe sequence), that the engine serves
        them (`WeightSyncError` otherwise); later rollouts carry this version."""
        probe = self.rollout.probe_due()
        self.rollout.load_weights(self.policy.named_weights(), version=self.step_count,
                                  expected_checksum=self.policy.weights_checksum(),
                                  expected_probe=None if probe is None else self.policy.probe_logprobs(probe))

    def rollout_and_score(self) -> tuple[Rollouts, Scores, torch.Tensor, torch.Tensor,
                                         dict[str, float], dict[str, float]]:
        """The step's rollouts and their scores, shaped rewards and trainable rows [N] bool.

        Rewards are the task score plus DAPO's overlong penalty (`algo.overlong_buffer`).
        With `algo.dynamic_sampling` (DAPO, Yu et al. 2025, sec. 3.2), groups whose shaped
        rewards are all equal (std <= `dynamic_sampling_tol`) are dropped and new prompts
        sampled for the missing groups, for at most `max_resample` extra rounds; a batch
        still short after that trains on the groups it has. If no group at all was
        informative, the last round is returned with no trainable row (no update).
        """
        cfg, algo = self.cfg, self.cfg.algo
        want = cfg.trainer.batch_size // cfg.rollout.n
        parts: list[tuple[Rollouts, Scores, torch.Tensor]] = []
        times = {"rollout": 0.0, "reward": 0.0}
        kept = dropped = rounds = 0
        generated, sampled_rewards = 0.0, []
        while True:
            t = time.perf_counter()
            rollouts = self.rollout.rollout(self.sampler.next(want - kept), self.sampling)
            times["rollout"] += time.perf_counter() - t
            t = time.perf_counter()
            scores = score_rollouts(rollouts.texts, rollouts.examples, cfg.reward)
            rewards = scores.total + overlong_penalty(rollouts.completion_lengths, cfg.rollout.max_new_tokens,
                                                      algo.overlong_buffer, algo.overlong_penalty)
            times["reward"] += time.perf_counter() - t
            generated += rollouts.completion_lengths.sum().item()
            sampled_rewards.append(scores.total)
            if not algo.dynamic_sampling:
                parts.append((rollouts, scores, rewards))
                break
            keep = informative_groups(rewards, rollouts.group, algo.dynamic_sampling_tol)
            num_groups = int(rollouts.group.max().item()) + 1
            kept_here = len(torch.unique(rollouts.group[keep]))
            if kept_here:
                rows = torch.nonzero(keep).flatten().tolist()
                part = take_rows(rollouts, rows)
                part.group = renumber_groups(part.group) + kept  # after the groups kept so far
                parts.append((part, take_rows(scores, rows), rewards[rows]))
            kept, dropped = kept + kept_here, dropped + num_groups - kept_here
            if kept >= want or rounds >= algo.max_resample:
                break
            rounds += 1
        if parts:
            rollouts = concat_records([p[0] for p in parts])
            scores = concat_records([p[1] for p in parts])
            rewards = torch.cat([p[2] for p in parts])
        # nothing informative: the last round stays for the metrics, no row is trained on
        trainable = torch.full((len(rollouts),), bool(parts), dtype=torch.bool)
        metrics = {"rollout/dropped_groups": float(dropped), "rollout/resample_rounds": float(rounds),
                   "rollout/groups": float(len(torch.unique(rollouts.group[trainable]))),
                   "rollout/generated_tokens": generated}
        if algo.overlong_buffer > 0:
            metrics["reward/overlong_penalty"] = (rewards - scores.total).mean().item()
        if algo.dynamic_sampling:
            metrics["reward/mean_before_filter"] = torch.cat(sampled_rewards).mean().item()
        return rollouts, scores, rewards, trainable, metrics, times

    # ---- evaluation -------------------------------------------------------------------

    def evaluate(self, examples: list[Example] | None = None) -> dict[str, float]:
        """Greedy decoding on the held-out set: accuracy (share of samples whose `correct`
        component is full marks) and reward, overall and per `data_source` when the set mixes
        sources (`eval/<source>/accuracy`), plus reward errors and timeouts."""
        examples = self.held_out if examples is None else examples
        if not examples:
            return {}
        t = time.perf_counter()
        totals, correct, truncated, lengths = [], [], [], []
        errors = timeouts = 0
        for start in range(0, len(examples), EVAL_CHUNK):
            chunk = examples[start: start + EVAL_CHUNK]
            rollouts = self.rollout.rollout(chunk, self.eval_sampling)
            # `correct` is always scored (weight 0 if the config does not use it).
            scores = score_rollouts(rollouts.texts, chunk, self.cfg.reward, always_correct=True)
            totals.append(scores.total)
            correct.append(scores.components["correct"])
            truncated.append(rollouts.truncated.float())
            lengths.append(rollouts.completion_lengths)
            errors, timeouts = errors + scores.errors, timeouts + scores.timeouts
        solved, total = (torch.cat(correct) >= 1.0).float(), torch.cat(totals)
        metrics = {
            "eval/accuracy": solved.mean().item(),
            "eval/reward_mean": total.mean().item(),
            "eval/truncated_frac": torch.cat(truncated).mean().item(),
            "eval/response_length_mean": torch.cat(lengths).mean().item(),
            "eval/num_examples": float(len(examples)),
            "eval/reward_errors": float(errors),
            "eval/reward_timeouts": float(timeouts),
        }
        sources = [e.data_source for e in examples]
        if len(set(sources)) > 1:
            for source in sorted(set(sources)):
                rows = torch.tensor([s == source for s in sources])
                name = source.replace("/", "_")
                metrics[f"eval/{name}/accuracy"] = solved[rows].mean().item()
                metrics[f"eval/{name}/reward_mean"] = total[rows].mean().item()
                metrics[f"eval/{name}/num_examples"] = float(rows.sum().item())
        metrics["time/eval"] = time.perf_counter() - t
        return metrics

    # ---- outputs ----------------------------------------------------------------------

    def save_checkpoint(self, run_dir: Path, eval_before: dict[str, float] | None = None) -> Path:
        """checkpoints/step_N (layout in `reasonrl.checkpoint`), then drop the oldest beyond
        `trainer.keep_last`. Call after the step's metrics and samples are logged: the logs'
        sizes now are where a resume cuts them back to."""
        target = run_dir / "checkpoints" / f"step_{self.step_count}"
        config = to_dict(self.cfg)
        offsets = {name: (run_dir / name).stat().st_size if (run_dir / name).exists() else 0
                   for name in ("metrics.jsonl", "samples.jsonl")}
        write_checkpoint(target, self.policy, self.workers.tokenizer, {
            "step": self.step_count, "sampler": self.sampler.state_dict(),
            "config": config, "config_hash": config_hash(config), "offsets": offsets,
            "eval_before": eval_before or {}, "bad_steps": self.bad_steps},
            merged=self.cfg.model.lora.save_merged)
        rotate(run_dir, self.cfg.trainer.keep_last)
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

    def open_run(self) -> tuple[Path, dict[str, float]]:
        """(run folder, held-out metrics before training). A resumed run cuts its logs back
        to the checkpoint (a step logged after it is redone, not duplicated) and reuses the
        eval it saved; a new run evaluates now."""
        cfg = self.cfg
        if self.resumed is not None:
            run_dir = self.run_dir
            remove_partial(run_dir)
            for name, offset in self.resumed["offsets"].items():
                truncate_log(run_dir / name, offset)
            (run_dir / "config.yaml").write_text(dump_yaml(cfg))
            print(f"[reasonrl] resuming {run_dir} from {self.resumed['path']} "
                  f"(step {self.step_count} of {cfg.trainer.steps})", flush=True)
            return run_dir, self.resumed["eval_before"]
        if self.run_dir is not None:  # resume=auto found no checkpoint: start the run over
            remove_partial(self.run_dir)
            for name in ("metrics.jsonl", "samples.jsonl"):
                (self.run_dir / name).unlink(missing_ok=True)
        run_dir = make_run_dir(cfg)
        print(f"[reasonrl] run directory: {run_dir}", flush=True)
        eval_before = self.evaluate()
        if eval_before:
            print(f"[reasonrl] held-out accuracy before training: {eval_before['eval/accuracy']:.3f} "
                  f"({int(eval_before['eval/num_examples'])} problems, greedy)", flush=True)
        return run_dir, eval_before

    def _stop_requested(self, signum, frame) -> None:
        if self.stop_signal is not None:  # asked twice: abandon the step now
            raise KeyboardInterrupt
        self.stop_signal = signal.Signals(signum).name
        print(f"\n[reasonrl] {self.stop_signal}: finishing step {self.step_count + 1}, then saving a "
              "checkpoint (send it again to stop at once and lose that step)", file=sys.stderr, flush=True)

    def _count_bad_step(self, metrics: dict[str, float]) -> None:
        """A step whose update met a non-finite loss or gradient (the worker skipped it)."""
        bad = metrics.get("train/updates", 0) > 0 and metrics.get("train/skipped_update", 0) > 0
        self.bad_steps = self.bad_steps + 1 if bad else 0
        metrics["train/bad_steps"] = float(self.bad_steps)
        if bad:
            print(f"[reasonrl] step {self.step_count}: non-finite loss or gradient, update skipped "
                  f"({self.bad_steps} in a row; abort at {self.cfg.trainer.max_bad_steps})",
                  file=sys.stderr, flush=True)

    def fit(self) -> RunResult:
        cfg = self.cfg
        run_dir, eval_before = self.open_run()
        tracker = Tracker(run_dir, cfg.trainer.steps, cfg.trainer.progress, start_step=self.step_count,
                          tracking=cfg.tracking, config=to_dict(cfg))
        if eval_before and self.resumed is None:
            tracker.log(0, eval_before)
        metrics: dict[str, float] = {}
        eval_after = eval_before
        handlers = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                handlers[sig] = signal.signal(sig, self._stop_requested)
            except ValueError:  # not the main thread: leave signals alone
                break
        try:
            while self.step_count < cfg.trainer.steps:
                metrics, rollouts, scores, advantages = self.step()
                step = self.step_count
                last = step == cfg.trainer.steps
                self._count_bad_step(metrics)
                if (cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0) or last:
                    eval_after = self.evaluate()
                    metrics.update(eval_after)
                tracker.log(step, metrics)
                tracker.samples(step, self.sample_rows(rollouts, scores, advantages))
                tracker.progress(metrics)
                if self.bad_steps >= cfg.trainer.max_bad_steps:
                    found = list_checkpoints(run_dir)
                    raise TrainingAborted(
                        f"{self.bad_steps} steps in a row (to step {step}) had a non-finite loss or "
                        f"gradient; stopping. Lower optim.lr or check the rewards; the last good "
                        f"checkpoint is {found[-1] if found else 'none'}")
                stop = self.stop_signal is not None
                if (cfg.trainer.save_every and step % cfg.trainer.save_every == 0) or last or stop:
                    self.save_checkpoint(run_dir, eval_before)
                if stop and not last:
                    raise TrainingInterrupted(self.stop_signal, run_dir, list_checkpoints(run_dir)[-1],
                                              step, 128 + signal.Signals[self.stop_signal].value)
        except KeyboardInterrupt:  # a second signal (or no handler): the step in progress is lost
            found = list_checkpoints(run_dir)
            raise TrainingInterrupted(self.stop_signal or "SIGINT", run_dir, found[-1] if found else None,
                                      int(found[-1].name.split("_")[1]) if found else 0,
                                      128 + signal.Signals[self.stop_signal or "SIGINT"].value) from None
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            tracker.close()
        summary = {"steps": self.step_count, "eval_before": eval_before, "eval_after": eval_after}
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        if eval_before:
            print(f"[reasonrl] held-out accuracy: {eval_before['eval/accuracy']:.3f} before -> "
                  f"{eval_after['eval/accuracy']:.3f} after {self.step_count} steps", flush=True)
        print(f"[reasonrl] wrote {run_dir}/ (config.yaml, metrics.jsonl, samples.jsonl, "
              f"checkpoints/step_{self.step_count}/huggingface)", flush=True)
        if cfg.tracking.report:
            from reasonrl.report import report_after_training

            report = report_after_training(run_dir)
            if report is not None:
                print(f"[reasonrl] report: {report}", flush=True)
        return RunResult(run_dir, eval_before, eval_after, metrics)


def train(cfg: Config) -> RunResult:
    trainer = Trainer(cfg)
    try:
        return trainer.fit()
    finally:
        trainer.workers.close()  # ray mode: stop this run's actors
