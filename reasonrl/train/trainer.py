"""The single controller. It holds no model: it moves batches between the workers.

One step, top to bottom (`Trainer.step`), each stage one named, timed call:
    prompts -> rollout (G samples each) -> rewards -> the policy's log-probs without gradient
    (once, read by the KL in the reward, the teacher stage and the update's old log-probs),
    reference log-probs (and the KL in the reward), the teacher's log-probs (on-policy
    distillation) and critic values (the forwards, when used) -> advantages (pure) -> critic
    update -> policy update -> sync
then metrics, samples, held-out eval and checkpoints (`Trainer.fit`). The batch comes from
the run's batch source (`reasonrl.source`): collected now, on-policy, or ahead on a rollout
side of its own by an older policy version (trainer.max_staleness > 0); the step reads the same
either way, and so do the sync (`publish`) and the held-out eval.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from reasonrl import console
from reasonrl.batch import PolicyLogprobs, StepBatch, TrainBatch
from reasonrl.checkpoint import CRITIC_DIR, check_config_changes, config_hash, read_checkpoint
from reasonrl.config import Config, to_dict
from reasonrl.data import load_examples
from reasonrl.evaluate import eval_settings, record_plan
from reasonrl.placement import build_workers, preflight
from reasonrl.rewards import check_examples
from reasonrl.rewards.failures import FailureLog
from reasonrl.rng import seed_everything, set_rng_state
from reasonrl.rollout import SamplingParams, check_prompt_lengths
from reasonrl.source import BatchSource, make_source, trainer_threads
from reasonrl.tracking import Tracker, counted
from reasonrl.train.advantage_stage import estimate_advantages
from reasonrl.train.bad_steps import BadSteps
from reasonrl.train.choices import decide as decide_choices
from reasonrl.train.choices import warn_slow_precision
from reasonrl.train.run_dir import RunDir, StopSignals, checkpoint_state, checkpoint_step, extend_command
from reasonrl.train.stages import logprobs_stage, reference_stage, teacher_stage, timed
from reasonrl.train.step_metrics import (
    ZeroRewardWatch,
    batch_metrics,
    gpu_memory_metrics,
    reset_gpu_peak,
    zero_reward_warning,
)
from reasonrl.workers.critic import read_weights as read_critic_weights


@dataclass
class RunResult:
    run_dir: Path
    eval_before: dict[str, float]
    eval_after: dict[str, float]
    last_metrics: dict[str, float]


def row_advantage(advantages: torch.Tensor, i: int, mask: list[int]) -> float:
    """Row i's advantage; a critic's token advantages as their mean over the row's model tokens
    (`mask`: the row's token mask, 1 on model tokens)."""
    row = advantages[i]
    if row.dim() == 0:
        return row.item()
    keep = torch.tensor(mask, dtype=torch.bool)
    return row[: len(mask)][keep].mean().item()


def with_epochs(cfg: Config, num_prompts: int) -> Config:
    """`cfg` with trainer.steps = ceil(epochs x num_prompts / prompts per step) when
    trainer.epochs > 0 (as TRL's num_train_epochs counts steps over the prompt dataset); the
    last step of an epoch is filled from the next epoch's shuffle. Unchanged otherwise."""
    t = cfg.trainer
    if t.epochs <= 0:
        return cfg
    per_step = t.batch_size // cfg.rollout.n
    steps = max(1, math.ceil(t.epochs * num_prompts / per_step))
    return dataclasses.replace(cfg, trainer=dataclasses.replace(t, steps=steps))


class Trainer:
    def __init__(self, cfg: Config, overwrite: bool = False):
        """Everything a run needs before its first step. `overwrite`: a new run replaces the run
        its folder holds (`--overwrite`) instead of being refused. A resume of a finished run
        (its checkpoint at trainer.steps) loads no model: `fit` says so and trains nothing."""
        self.cfg, t, r = cfg, cfg.trainer, cfg.rollout
        preflight(cfg)  # a missing extra or resource fails now, before any model loads
        warn_slow_precision(cfg)  # an explicit bf16 on a CPU without bf16 units: said before anything
        self.train_examples, self.held_out = load_examples(cfg.data, t.seed)
        if t.epochs > 0:
            self.cfg = cfg = with_epochs(cfg, len(self.train_examples))
            t = cfg.trainer
            console.info(f"trainer.epochs={t.epochs:g}: {t.steps} steps ({len(self.train_examples)} "
                         f"prompts, {t.batch_size // r.n} per step)", steps=t.steps)
        self.overwrite, self.workers = overwrite, None
        self.source: BatchSource | None = None  # built with the workers (none for a finished run)
        self.run = RunDir.locate(cfg)  # a resumed run's lock (a new run's: in `fit`) until `fit` ends
        try:
            RunDir.check_new(cfg, overwrite)  # a run already in the folder: refused before the model loads
            # the automatic choices (decoder, precision, budget, threads), once: a resume takes the
            # checkpoint's, a new run decides them now; the saved config holds them
            state = checkpoint_state(self.run.checkpoint) if self.run.checkpoint is not None else None
            saved = (state or {}).get("config")
            self.cfg = cfg = decide_choices(cfg, saved if isinstance(saved, dict) else None)
            t = cfg.trainer
            torch.set_num_threads(trainer_threads(cfg))  # shared with a rollout process beside, if any
            check_examples(self.train_examples + self.held_out, cfg.reward)  # bad ground truth: fail now
            progress = t.progress and "console" in cfg.tracking.backends  # the held-out eval's bar
            self.eval_settings = eval_settings(cfg, entropy=False, progress=progress)
            record_plan(self.held_out, self.eval_settings)  # a record's bad extra_info.n / pass@k: fail now
            done = checkpoint_step(self.run.checkpoint) if self.run.checkpoint is not None else None
            self.finished = done if done is not None and done >= t.steps else None  # resumed at its end
            if self.finished is not None:  # a changed config is refused as for any resume
                saved = (checkpoint_state(self.run.checkpoint) or {}).get("config")
                if isinstance(saved, dict):
                    check_config_changes(self.run.checkpoint, saved, to_dict(cfg), t.allow_config_change)
            else:
                self.build(cfg)
        except BaseException:
            self.run.release()
            raise

    def build(self, cfg: Config) -> None:
        """Workers, the batch source and the checkpoint resumed from (read under the run's lock)."""
        t, r = cfg.trainer, cfg.rollout
        self.workers = build_workers(cfg)
        # Seed after loading: a first-run model conversion draws random numbers (weight
        # init before the GGUF weights are copied in); the run must not depend on the cache.
        seed_everything(t.seed)
        self.policy, self.rollout, self.critic = (self.workers.policy, self.workers.rollout,
                                                  self.workers.critic)
        self.teacher = self.workers.teacher  # on-policy distillation (teacher.path) only
        self.reference = self.workers.reference  # algo.beta > 0 or algo.log_kl only
        # every prompt too long for data.max_prompt_tokens, listed now, not at step 500 (or cut: said)
        check_prompt_lengths(self.rollout, self.train_examples, cfg.data.max_prompt_tokens,
                             held_out=self.held_out)
        sampling = SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                  max_new_tokens=r.max_new_tokens)
        self.source = make_source(cfg, self.workers, self.train_examples, self.held_out, self.eval_settings,
                                  sampling)
        self.step_count = 0
        self.bad = BadSteps(cfg, self.run.last_good)  # steps in a row with a non-finite update or no reward
        self.reward_failures = FailureLog()
        self.zero_rewards = ZeroRewardWatch()  # steps in a row with every reward 0: said once
        self.resumed: dict | None = None  # the trainer_state of the checkpoint resumed from
        self.stop = StopSignals(lambda: f"step {self.step_count + 1}")  # SIGINT/SIGTERM during `fit`
        if self.run.checkpoint is not None:
            self.load_checkpoint(self.run.checkpoint)

    def load_checkpoint(self, path: Path) -> None:
        """Continue exactly where `path` stopped: weights, optimizer, scheduler, sampler,
        RNGs and step. Refuses a config that changed in keys not listed in
        `trainer.allow_config_change` or that a resume cannot change; the changed ones it accepts
        are this run's from its first step (the optimizer's settings: `Learner.apply_settings`)."""
        state, tensors, weights = read_checkpoint(path)
        changes = check_config_changes(path, state["config"], to_dict(self.cfg),
                                       self.cfg.trainer.allow_config_change)
        self.policy.load_weights(weights)
        self.policy.load_state_dict(tensors["policy"])
        if self.critic is not None:
            self.critic.load_weights(read_critic_weights(path / CRITIC_DIR))
            self.critic.load_state_dict(tensors["critic"])
        self.source.restore(state["sampler"], tensors.get("in_flight"))
        self.step_count, self.bad.count = state["step"], state["bad_steps"]
        if changes:
            console.info(f"resuming with changed settings, in force from step {self.step_count + 1}: "
                         + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items()))
        self.source.publish(self.step_count)  # the loaded weights are this version
        set_rng_state(tensors["rng"])
        self.resumed = {**state, "path": str(path)}

    # ---- one training step -----------------------------------------------------------

    def step(self) -> tuple[dict[str, float], StepBatch, torch.Tensor]:
        """One training step: each stage one named call, timed as `time/<stage>` (rollout and
        reward inside the source's `collect_batch`, which may resample), every model forward
        among them."""
        algo = self.cfg.algo
        reset_gpu_peak()
        t0 = time.perf_counter()
        trained_version = self.step_count  # the version this step's update starts from
        batch, produced = self.source.take(self.step_count)  # rollout + reward, now or made ahead
        rollouts, times = batch.rollouts, dict(batch.seconds)
        loss_mask = batch.trainable & ~rollouts.truncated if algo.mask_truncated else batch.trainable
        ids = rollouts.prompt_ids, rollouts.completion_ids
        ref = kl = values = scores = None
        logp = PolicyLogprobs()
        updates = self.critic is None or self.step_count >= self.cfg.critic.warmup_steps
        kl_in_reward = algo.beta > 0 and algo.kl_in == "reward"
        several = self.cfg.optim.ppo_epochs * self.cfg.optim.mini_batches > 1  # updates read old log-probs
        trained = updates and (self.teacher is not None or several)
        if kl_in_reward or trained:  # the policy's forward without gradient, once per layout read
            logp = timed(times, "logprobs", logprobs_stage, self.policy, ids, loss_mask, kl_in_reward,
                         trained)
        if kl_in_reward or (updates and (algo.beta > 0 or algo.log_kl)):  # the reference forward, once
            ref, kl = timed(times, "reference", reference_stage, self.reference, self.policy, ids, loss_mask,
                            algo, logp)
        if self.teacher is not None and updates:  # the teacher's forward
            scores = timed(times, "teacher", teacher_stage, self.teacher, logp.trained, ids, loss_mask,
                           self.cfg.teacher)
        if self.critic is not None:
            values = timed(times, "values", self.critic.values, *ids)  # the critic's forward
        advantages, critic_batch, metrics = timed(times, "advantage", estimate_advantages,
                                                  batch, kl, values, loss_mask, algo, scores)
        if critic_batch is not None:
            metrics.update(timed(times, "critic", self.critic.train_step, critic_batch))
        if updates:
            train = TrainBatch(rollouts.prompt_ids, rollouts.completion_ids, advantages, loss_mask,
                               rollouts.sampler_logprobs, rollouts.token_mask, ref, logp.trained)
            metrics.update(timed(times, "update", self.policy.train_step, train))
        self.bad.stop_if_weights_broke(self.step_count + 1, metrics)  # before the sync: they go nowhere
        self.step_count += 1  # the policy is now at version step_count
        timed(times, "sync", self.source.publish, self.step_count, self.eval_due(self.step_count))
        times["step"] = time.perf_counter() - t0
        metrics.update(batch_metrics(batch, advantages, loss_mask, trained_version))
        metrics.update(produced)
        metrics.update({f"time/{k}": v for k, v in times.items()})
        metrics.update(gpu_memory_metrics())
        return metrics, batch, advantages

    def eval_due(self, step: int) -> bool:
        """The held-out eval runs after this step (every `trainer.eval_every`, and after the last)."""
        every = self.cfg.trainer.eval_every
        return bool(self.held_out) and (bool(every) and step % every == 0 or step == self.cfg.trainer.steps)

    def evaluate(self) -> dict[str, float]:
        """The held-out set's `eval/` metrics (pass@k overall and per data_source) with the `eval`
        section's settings (default greedy, one sample), from the batch source: the same
        function and numbers as `reasonrl eval` with those settings (`--greedy`)."""
        if not self.held_out:
            return {}
        return self.source.evaluate(self.step_count)

    # ---- the loop ---------------------------------------------------------------------

    def open_run(self) -> tuple[Path, dict[str, float]]:
        """(run folder, held-out metrics before training): a resumed run reuses the eval it
        saved, a new run evaluates now."""
        resumed = self.resumed
        run_dir = self.run.open(self.cfg, None if resumed is None else resumed["offsets"], self.overwrite)
        if resumed is not None:
            console.info(f"resuming {run_dir} from {resumed['path']} "
                         f"(step {self.step_count} of {self.cfg.trainer.steps})", run_dir=str(run_dir),
                         step=self.step_count)
            return run_dir, resumed["eval_before"]
        console.info(f"run directory: {run_dir}", run_dir=str(run_dir))
        eval_before = self.evaluate()
        if eval_before:
            s = self.eval_settings
            how = "greedy" if s.greedy else f"sampled at T={s.temperature:g}"
            console.info(f"held-out accuracy before training: {eval_before['eval/accuracy']:.3f} "
                         f"({counted(int(eval_before['eval/num_prompts']), 'problem')}, {how})",
                         accuracy=eval_before['eval/accuracy'])
        return run_dir, eval_before

    def save_checkpoint(self, eval_before: dict[str, float]) -> Path:
        """checkpoints/step_N; with batches in flight (asynchronous training) they are kept too,
        with the rollout side's state after them (its sampler's is the one saved)."""
        config = to_dict(self.cfg)
        sampler, in_flight = self.source.state(self.step_count)
        extra = None if in_flight is None else {"in_flight": in_flight}
        state = {"sampler": sampler, "config": config, "config_hash": config_hash(config),
                 "eval_before": eval_before, "bad_steps": self.bad.count}
        return self.run.save(self.step_count, self.policy, self.workers.tokenizer, state,
                             self.cfg.model.lora.save_merged, self.cfg.trainer.keep_last, self.critic,
                             extra=extra)

    def report_reward_failures(self, failures: list[str | None] | None) -> None:
        """Each kind of reward failure printed once, with its message (then only counted)."""
        for message in self.reward_failures.new(failures):
            console.warning(f"step {self.step_count}: a reward failed and scored 0: {message} (first of "
                            "its kind; later ones are counted in reward/errors, reward/timeouts)", label="",
                            step=self.step_count)

    def sample_rows(self, batch: StepBatch, advantages: torch.Tensor) -> list[dict]:
        """One completion from each of the first `trainer.log_samples` groups (more variety
        than one group's)."""
        rollouts, scores, n = batch.rollouts, batch.scores, self.cfg.rollout.n
        starts = range(0, len(rollouts), n) if rollouts.episode is None else \
            sorted({int(g): i for i, g in reversed(list(enumerate(rollouts.group.tolist())))}.values())
        picks = list(starts)[: self.cfg.trainer.log_samples]  # an agent's split episodes: their first rows
        rows = [{"prompt": rollouts.examples[i].prompt, "ground_truth": rollouts.examples[i].ground_truth,
                 "completion": rollouts.texts[i], "reward": scores.total[i].item(),
                 "components": {k: v[i].item() for k, v in scores.components.items()},
                 "advantage": row_advantage(advantages, i, rollouts.token_mask[i]),
                 "truncated": bool(rollouts.truncated[i])} for i in picks]
        if scores.failures:  # why a reward scored 0 without a verdict
            for row, i in zip(rows, picks, strict=True):
                if scores.failures[i] is not None:
                    row["reward_error"] = scores.failures[i]
        if rollouts.episodes is not None:  # multi-turn: each turn (model, tool call, observation)
            for row, i in zip(rows, picks, strict=True):
                row["turns"] = [dataclasses.asdict(turn) for turn in rollouts.episodes.turns[i]]
        return rows

    def fit(self) -> RunResult:
        """Train to trainer.steps (`train_steps`); the run directory's lock is given back at the
        end, however the run ends. A finished run (resumed at trainer.steps) trains nothing."""
        try:
            if self.finished is not None:
                return self.already_finished()
            return self.train_steps()
        finally:
            if self.source is not None:
                self.source.close()  # a rollout side stopped with the run
            self.run.release()

    def already_finished(self) -> RunResult:
        """A resume of a run whose checkpoint is at (or past) trainer.steps: nothing to train.
        It says so, with the held-out numbers its summary.json holds and the command that trains
        it further, and writes nothing (summary.json, logs and report stay the run's own)."""
        run_dir, step = self.run.path, self.finished
        summary: dict = {}
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except (OSError, ValueError):
            pass
        before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
        held_out = ""
        if "eval/accuracy" in before and "eval/accuracy" in after:
            held_out = (f"; held-out accuracy {before['eval/accuracy']:.3f} before -> "
                        f"{after['eval/accuracy']:.3f} after {counted(summary.get('steps', step), 'step')} "
                        "(its summary.json)")
        console.info(f"{run_dir} is finished: its checkpoint {self.run.checkpoint.name} is at step "
                     f"{step} of trainer.steps={self.cfg.trainer.steps}, nothing to train{held_out}. "
                     f"To train it further: {extend_command(run_dir, step)}", run_dir=str(run_dir), step=step)
        return RunResult(run_dir, before, after, {})

    def train_steps(self) -> RunResult:
        cfg = self.cfg
        run_dir, eval_before = self.open_run()
        tracker = Tracker(run_dir, cfg.trainer.steps, cfg.trainer.progress, start_step=self.step_count,
                          tracking=cfg.tracking, config=to_dict(cfg), write_error=self.run.log_write_error)
        if eval_before and self.resumed is None:
            tracker.log(0, eval_before)
        metrics, eval_after = {}, eval_before
        with self.stop as stop:
            try:
                while self.step_count < cfg.trainer.steps:
                    metrics, eval_after = self.train_and_log(tracker, eval_after)
                    last, every = self.step_count == cfg.trainer.steps, cfg.trainer.save_every
                    if (every and self.step_count % every == 0) or last or stop.requested:
                        self.save_checkpoint(eval_before)
                    if stop.requested and not last:
                        raise self.run.interrupted(stop.requested, self.step_count)
            except KeyboardInterrupt:  # a second signal (or no handler): the step in progress is lost
                raise self.run.interrupted(stop.requested or "SIGINT") from None
            finally:
                tracker.close()
        return self.finish(eval_before, eval_after, metrics)

    def train_and_log(self, tracker: Tracker, eval_after: dict[str, float]) -> tuple[dict, dict]:
        """One step, its bad-step check, the held-out eval when due; all logged."""
        metrics, batch, advantages = self.step()
        self.report_reward_failures(batch.scores.failures)
        self.bad.update(self.step_count, metrics, batch.scores.failures)
        if self.zero_rewards.update(self.step_count, metrics):  # once per run
            cfg, first = self.cfg, self.zero_rewards.first
            console.warning(zero_reward_warning(first, self.step_count, metrics, cfg.rollout.max_new_tokens,
                                                cfg.reward.task, str(self.run.path)), write=tracker.write)
        if self.eval_due(self.step_count):
            eval_after = self.evaluate()
            metrics.update(eval_after)
        tracker.log(self.step_count, metrics)
        tracker.samples(self.step_count, self.sample_rows(batch, advantages))
        tracker.progress(metrics)
        self.bad.abort_if_stuck(self.step_count)
        return metrics, eval_after

    def finish(self, eval_before: dict, eval_after: dict, metrics: dict) -> RunResult:
        run_dir = self.run.path
        self.run.write_summary({"steps": self.step_count, "eval_before": eval_before,
                                "eval_after": eval_after})
        if eval_before:
            console.info(f"held-out accuracy: {eval_before['eval/accuracy']:.3f} before -> "
                         f"{eval_after['eval/accuracy']:.3f} after {counted(self.step_count, 'step')}",
                         before=eval_before['eval/accuracy'], after=eval_after['eval/accuracy'])
        console.info(f"wrote {run_dir}/ (config.yaml, metrics.jsonl, samples.jsonl, "
                     f"checkpoints/step_{self.step_count}/huggingface)", run_dir=str(run_dir),
                     step=self.step_count)
        if self.cfg.tracking.report:
            from reasonrl.report import report_after_training

            report = report_after_training(run_dir)
            if report is not None:
                console.info(f"report: {report}", path=str(report))
        return RunResult(run_dir, eval_before, eval_after, metrics)


def train(cfg: Config, overwrite: bool = False) -> RunResult:
    """Train with `cfg` (`overwrite`: replace the run already in the run's folder), its console
    lines in `trainer.console`'s mode."""
    with console.using(cfg.trainer.console):
        trainer = Trainer(cfg, overwrite)
        try:
            return trainer.fit()
        finally:
            if trainer.workers is not None:  # none for a finished run
                trainer.workers.close()  # engines freed, ray actors stopped
