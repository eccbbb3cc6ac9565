"""`reasonrl sft`: supervised fine-tuning on `train`'s machinery.

One step: `trainer.batch_size` records from the resumable, seeded sampler (`PromptSampler`,
shuffled epochs) -> the policy worker's `Learner` (the one RL trains with: token-budget
micro-batches, precision, LoRA, gradient clipping, the skip rule) runs forward ->
`reasonrl.algo.sft.sft_objective` -> backward per micro-batch, one optimizer step. Around it,
as `train`: the run directory (`RunDir`: the lock, `--overwrite`, atomic checkpoints with the
optimizer, sampler and RNG state, exact resume, rotation), the automatic choices decided once
and saved (`reasonrl.train.choices`), `BadSteps`, the `Tracker` (metrics.jsonl, the progress bar,
TensorBoard / WandB) and report.html. The held-out evaluation is the token-mean loss and the
perplexity of `sft.val_path`'s records (or the solver's held-out solutions), and, with
`sft.generate_eval`, the accuracy by generation `train` measures (`reasonrl.evaluate` on the
data section's held-out problems, scored by the reward's verifier), before training, every
`trainer.eval_every` steps and after the last.

The workers are `placement`'s local ones (`build_workers`): the policy worker (its model,
LoRA adapter and learner) and the rollout worker whose engine generates the held-out answers,
kept in step by the run's `WeightSync`. Nothing in the config's `algo`, `critic` or `teacher`
sections is used. A checkpoint's `huggingface/` folder is an ordinary model folder:
`reasonrl train CONFIG model.path=runs/<name>/checkpoints/step_N` starts RL from it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from pathlib import Path

import torch

from reasonrl import console
from reasonrl.algo import Metric, Totals
from reasonrl.algo.sft import perplexity, sft_objective
from reasonrl.checkpoint import check_config_changes, config_hash, read_checkpoint
from reasonrl.config import AlgoConfig, Config, CriticConfig, TeacherConfig, to_dict
from reasonrl.data import PromptSampler, system_prompt_for, take_per_source
from reasonrl.errors import ConfigError
from reasonrl.evaluate import eval_settings, record_plan
from reasonrl.model.forward import completion_logprobs, pick
from reasonrl.placement import build_workers, preflight
from reasonrl.registry import DATA_TASKS
from reasonrl.rewards import check_examples
from reasonrl.rng import seed_everything, set_rng_state
from reasonrl.rollout import check_prompt_lengths
from reasonrl.sft.records import SFTRecord, load_records
from reasonrl.sft.rows import RowSettings, SFTRow, stop_token_ids, to_rows
from reasonrl.sft.solutions import solution_records
from reasonrl.source import trainer_threads
from reasonrl.source.held_out import held_out_metrics
from reasonrl.tracking import Tracker, counted
from reasonrl.train.bad_steps import BadSteps
from reasonrl.train.choices import decide as decide_choices
from reasonrl.train.choices import warn_slow_precision
from reasonrl.train.run_dir import RunDir, StopSignals, checkpoint_state, checkpoint_step

KIND = "sft"  # trainer_state.json's `kind` of an SFT checkpoint


@dataclasses.dataclass
class SFTResult:
    run_dir: Path
    eval_before: dict[str, float]
    eval_after: dict[str, float]
    last_metrics: dict[str, float]


def sft_records(cfg: Config, problems: tuple[list, list] | None) -> tuple[list[SFTRecord], list[SFTRecord]]:
    """(training records, held-out records) of `cfg.sft`: the files', or with `sft.source=solver`
    the data task's problems (`problems`: its train and held-out examples) with their solutions."""
    s = cfg.sft
    if s.source == "solver":
        train, held_out = problems
        return (solution_records(train, cfg.data.task),
                solution_records(held_out, cfg.data.task, "held-out") if held_out else [])
    if not s.train_path:
        raise ConfigError("sft.train_path: empty; give the SFT records ({prompt, completion} or {messages}: "
                          "JSONL, Parquet, a `datasets` folder or a Hub id), or sft.source=solver")
    train = load_records(s.train_path, s.fields, s.train_subset, s.train_split)
    held_out = load_records(s.val_path, s.fields, s.val_subset, s.val_split) if s.val_path else []
    return train, held_out


def task_problems(cfg: Config) -> tuple[list, list]:
    """(train, held-out) examples of the data section's task, the held-out ones capped by
    data.val_size as `train` caps them (`reasonrl.data.load_examples`, without its rule that the
    training set is not empty: SFT may use the held-out ones alone)."""
    train, held_out = DATA_TASKS.get(cfg.data.task)(cfg.data, cfg.trainer.seed)
    if cfg.data.val_size:
        held_out = take_per_source(held_out, cfg.data.val_size)
    return train, held_out


def worker_config(cfg: Config) -> Config:
    """The config the workers are built from: `cfg` without the RL-only models (no reference
    model, critic or teacher is loaded for SFT)."""
    return dataclasses.replace(cfg, algo=AlgoConfig(), critic=CriticConfig(), teacher=TeacherConfig())


def with_epochs(cfg: Config, records: int) -> Config:
    """`cfg` with trainer.steps = ceil(epochs x records / trainer.batch_size) when trainer.epochs
    > 0 (TRL's num_train_epochs); unchanged otherwise."""
    t = cfg.trainer
    if t.epochs <= 0:
        return cfg
    steps = max(1, math.ceil(t.epochs * records / t.batch_size))
    return dataclasses.replace(cfg, trainer=dataclasses.replace(t, steps=steps))


class SFTTrainer:
    """Everything an SFT run needs before its first step, then `fit` (module docstring)."""

    def __init__(self, cfg: Config, overwrite: bool = False):
        if cfg.placement.mode != "local":
            raise ConfigError(f"placement.mode={cfg.placement.mode}: reasonrl sft runs its workers in this "
                              "process; use placement.mode=local")
        t = cfg.trainer
        preflight(worker_config(cfg))  # a missing extra fails now, before any model loads
        warn_slow_precision(cfg)
        problems = task_problems(cfg) if cfg.sft.source == "solver" or cfg.sft.generate_eval else None
        self.records, self.held_out_records = sft_records(cfg, problems)
        if cfg.sft.val_size:
            self.held_out_records = self.held_out_records[: cfg.sft.val_size]
        self.problems = problems[1] if problems is not None and cfg.sft.generate_eval else []
        if t.epochs > 0:
            cfg = with_epochs(cfg, len(self.records))
            console.info(f"trainer.epochs={t.epochs:g}: {cfg.trainer.steps} steps ({len(self.records)} "
                         f"records, {t.batch_size} per step)", steps=cfg.trainer.steps)
        self.cfg, self.overwrite, self.workers = cfg, overwrite, None
        self.run = RunDir.locate(cfg)
        try:
            RunDir.check_new(cfg, overwrite)
            state = checkpoint_state(self.run.checkpoint) if self.run.checkpoint is not None else None
            if state is not None and state.get("kind") != KIND:
                raise ConfigError(f"{self.run.checkpoint} is a checkpoint of `reasonrl train`, not of an SFT "
                                  "run: resume it with `reasonrl train --resume`, or start SFT from its "
                                  f"weights with model.path={self.run.checkpoint}")
            saved = (state or {}).get("config")
            self.cfg = cfg = decide_choices(cfg, saved if isinstance(saved, dict) else None)
            torch.set_num_threads(trainer_threads(cfg))
            check_examples(self.problems, cfg.reward)  # a held-out problem the verifier cannot read: now
            progress = cfg.trainer.progress and "console" in cfg.tracking.backends
            self.eval_settings = eval_settings(cfg, entropy=False, progress=progress)
            record_plan(self.problems, self.eval_settings)
            done = checkpoint_step(self.run.checkpoint) if self.run.checkpoint is not None else None
            self.finished = done if done is not None and done >= cfg.trainer.steps else None
            if self.finished is not None:
                if isinstance(saved, dict):
                    check_config_changes(self.run.checkpoint, saved, to_dict(cfg),
                                         cfg.trainer.allow_config_change)
            else:
                self.build(cfg)
        except BaseException:
            self.run.release()
            raise

    def build(self, cfg: Config) -> None:
        """Workers, the tokenised records, the sampler and the checkpoint resumed from."""
        self.workers = build_workers(worker_config(cfg))
        seed_everything(cfg.trainer.seed)  # after loading, as `train`: a conversion draws random numbers
        self.policy, self.rollout = self.workers.policy, self.workers.rollout
        tokenizer = self.workers.tokenizer
        self.learner = self.policy.learner
        s, d = cfg.sft, cfg.data
        stops = stop_token_ids(self.policy.model, tokenizer)
        tools = tuple(getattr(self.rollout, "tools", ()) or ())  # the environment's, as train renders them
        self.row_settings = RowSettings(d.apply_chat_template, system_prompt_for(d), s.completion_only,
                                        s.max_tokens, s.truncate, stops, tools)
        self.rows = to_rows(self.records, tokenizer, self.row_settings, "training records")
        self.held_out_rows = to_rows(self.held_out_records, tokenizer, self.row_settings, "held-out records")
        if self.problems:  # every held-out prompt too long for data.max_prompt_tokens: now
            check_prompt_lengths(self.rollout, self.problems, d.max_prompt_tokens)
        trained, tokens = sum(r.trained for r in self.rows), sum(r.tokens for r in self.rows)
        problems = (f", {counted(len(self.problems), 'held-out problem')} for the accuracy" if self.problems
                    else "")
        console.info(f"SFT data: {counted(len(self.rows), 'training record')} ({trained:,} trained "
                     f"tokens of {tokens:,}), "
                     f"{counted(len(self.held_out_rows), 'held-out record')}{problems}")
        self.sampler = PromptSampler(self.rows, cfg.trainer.seed, d.shuffle)
        self.step_count = 0
        self.bad = BadSteps(cfg, self.run.last_good, command="sft")
        self.resumed: dict | None = None
        self.stop = StopSignals(lambda: f"step {self.step_count + 1}")
        if self.run.checkpoint is not None:
            self.load_checkpoint(self.run.checkpoint)
        else:
            self.workers.sync.push(0)

    def load_checkpoint(self, path: Path) -> None:
        """Continue exactly where `path` stopped: weights, optimizer and schedule, sampler, RNGs,
        step (a changed config refused as `train` refuses it)."""
        state, tensors, weights = read_checkpoint(path)
        changes = check_config_changes(path, state["config"], to_dict(self.cfg),
                                       self.cfg.trainer.allow_config_change)
        self.policy.load_weights(weights)
        self.policy.load_state_dict(tensors["policy"])
        self.sampler.load_state_dict(state["sampler"])
        self.step_count, self.bad.count = state["step"], state["bad_steps"]
        if changes:
            console.info(f"resuming with changed settings, in force from step {self.step_count + 1}: "
                         + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items()))
        self.workers.sync.push(self.step_count)
        set_rng_state(tensors["rng"])
        self.resumed = {**state, "path": str(path)}

    # ---- one step ---------------------------------------------------------------------

    def objective(self, totals: Totals, mb) -> tuple[torch.Tensor, dict[str, Metric]]:
        """One micro-batch's forward and `sft_objective` (log-probs at temperature 1)."""
        logp, _ = completion_logprobs(self.learner.model, mb)
        return sft_objective(logp, mb.mask, totals)

    def step(self) -> tuple[dict[str, float], list[SFTRow]]:
        """One optimizer step on the next `trainer.batch_size` records (with optim.mini_batches
        or optim.ppo_epochs above 1, that many: each slice normalised by its own tokens)."""
        t0 = time.perf_counter()
        rows: list[SFTRow] = self.sampler.next(self.cfg.trainer.batch_size)
        prompts = [r.prompt_ids for r in rows]
        completions = [r.completion_ids for r in rows]
        masks = [r.token_mask for r in rows]
        trained = [r.trained for r in rows]
        lr = self.learner.lr

        def update(idx: list[int]) -> dict[str, Metric]:
            objective = functools.partial(self.objective, Totals.of(pick(trained, idx)))
            return self.learner.update(pick(prompts, idx), pick(completions, idx), pick(masks, idx),
                                       objective)

        t = time.perf_counter()
        found, updates = self.learner.train(len(rows), update)
        update_s = time.perf_counter() - t
        loss = found.pop("loss", math.nan)
        metrics = {"sft/loss": loss, "sft/perplexity": perplexity(loss) if math.isfinite(loss) else math.nan,
                   "sft/tokens": float(sum(trained)), "sft/records": float(len(rows)),
                   "sft/epoch": float(self.sampler.epoch)}
        metrics.update({f"train/{k}": v for k, v in found.items()})
        metrics.update({"train/lr": lr, "train/updates": float(updates)})
        self.bad.stop_if_weights_broke(self.step_count + 1, metrics)
        self.step_count += 1
        t = time.perf_counter()
        self.workers.sync.push(self.step_count)  # the engine serves this version (checked)
        metrics.update({"time/update": update_s, "time/sync": time.perf_counter() - t,
                        "time/step": time.perf_counter() - t0})
        return metrics, rows

    def eval_due(self, step: int) -> bool:
        every = self.cfg.trainer.eval_every
        return bool(every) and step % every == 0 or step == self.cfg.trainer.steps

    @torch.no_grad()
    def held_out_loss(self) -> dict[str, float]:
        """The token-mean loss and perplexity of the held-out records (`eval/loss`,
        `eval/perplexity`), in the learner's micro-batches, in eval mode (no dropout)."""
        rows = self.held_out_rows
        if not rows:
            return {}
        model, was = self.learner.model, self.learner.model.training
        model.eval()
        total = 0.0
        try:
            layout = ([r.prompt_ids for r in rows], [r.completion_ids for r in rows],
                      [r.token_mask for r in rows])
            for mb in self.learner.micro_batches(*layout):
                mb = mb.to(self.learner.device)
                logp, _ = completion_logprobs(model, mb)
                total += -(logp.float() * mb.mask).sum().item()
        finally:
            model.train(was)
        tokens = sum(r.trained for r in rows)
        mean = total / max(tokens, 1)
        return {"eval/loss": mean, "eval/perplexity": perplexity(mean), "eval/loss_tokens": float(tokens),
                "eval/loss_records": float(len(rows))}

    def evaluate(self) -> dict[str, float]:
        """The held-out loss and perplexity, and the accuracy by generation (`train`'s eval), with
        `time/eval`."""
        t = time.perf_counter()
        metrics = self.held_out_loss()
        if self.problems:
            metrics.update(held_out_metrics(self.rollout, self.problems, self.eval_settings, self.cfg.reward))
        if metrics:
            metrics["time/eval"] = time.perf_counter() - t
        return metrics

    # ---- the loop ---------------------------------------------------------------------

    def fit(self) -> SFTResult:
        try:
            if self.finished is not None:
                return self.already_finished()
            return self.train_steps()
        finally:
            self.run.release()

    def already_finished(self) -> SFTResult:
        run_dir, step = self.run.path, self.finished
        summary: dict = {}
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except (OSError, ValueError):
            pass
        console.info(f"{run_dir} is finished: its checkpoint {self.run.checkpoint.name} is at step "
                     f"{step} of trainer.steps={self.cfg.trainer.steps}, nothing to train{said(summary)}. "
                     f"To train it further: reasonrl sft --resume {run_dir} trainer.steps=N "
                     f"--allow-config-change trainer.steps (N > {step})", run_dir=str(run_dir), step=step)
        return SFTResult(run_dir, summary.get("eval_before") or {}, summary.get("eval_after") or {}, {})

    def open_run(self) -> tuple[Path, dict[str, float]]:
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
            console.info(f"held-out before training: {held_out_line(eval_before)}")
        return run_dir, eval_before

    def save_checkpoint(self, eval_before: dict[str, float]) -> Path:
        config = to_dict(self.cfg)
        state = {"kind": KIND, "sampler": self.sampler.state_dict(), "config": config,
                 "config_hash": config_hash(config), "eval_before": eval_before, "bad_steps": self.bad.count}
        return self.run.save(self.step_count, self.policy, self.workers.tokenizer, state,
                             self.cfg.model.lora.save_merged, self.cfg.trainer.keep_last)

    def sample_rows(self, rows: list[SFTRow]) -> list[dict]:
        """The first `trainer.log_samples` records of the step as the model saw them: the prompt
        and the completion decoded, and the trained part alone (`trained`: the masked tokens)."""
        tok = self.workers.tokenizer
        return [{"where": r.where, "prompt": tok.decode(r.prompt_ids),
                 "completion": tok.decode(r.completion_ids),
                 "trained": tok.decode([t for t, m in zip(r.completion_ids, r.token_mask, strict=True) if m]),
                 "trained_tokens": r.trained} for r in rows[: self.cfg.trainer.log_samples]]

    def train_steps(self) -> SFTResult:
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
                    metrics, rows = self.step()
                    self.bad.update(self.step_count, metrics, None)
                    if self.eval_due(self.step_count):
                        eval_after = self.evaluate()
                        metrics.update(eval_after)
                    tracker.log(self.step_count, metrics)
                    tracker.samples(self.step_count, self.sample_rows(rows))
                    tracker.progress(metrics)
                    self.bad.abort_if_stuck(self.step_count)
                    last, every = self.step_count == cfg.trainer.steps, cfg.trainer.save_every
                    if (every and self.step_count % every == 0) or last or stop.requested:
                        self.save_checkpoint(eval_before)
                    if stop.requested and not last:
                        raise self.run.interrupted(stop.requested, self.step_count)
            except KeyboardInterrupt:
                raise self.run.interrupted(stop.requested or "SIGINT") from None
            finally:
                tracker.close()
        return self.finish(eval_before, eval_after, metrics)

    def finish(self, eval_before: dict, eval_after: dict, metrics: dict) -> SFTResult:
        run_dir = self.run.path
        self.run.write_summary({"kind": KIND, "steps": self.step_count, "eval_before": eval_before,
                                "eval_after": eval_after})
        if eval_before:
            console.info(f"held-out: {held_out_line(eval_before)} before -> {held_out_line(eval_after)} "
                         f"after {counted(self.step_count, 'step')}")
        checkpoint = run_dir / "checkpoints" / f"step_{self.step_count}"
        console.info(f"wrote {run_dir}/ (config.yaml, metrics.jsonl, {checkpoint.relative_to(run_dir)}"
                     f"/huggingface); RL from it: reasonrl train CONFIG model.path={checkpoint}",
                     run_dir=str(run_dir), checkpoint=str(checkpoint))
        if self.cfg.tracking.report:
            from reasonrl.report import report_after_training

            report = report_after_training(run_dir)
            if report is not None:
                console.info(f"report: {report}", path=str(report))
        return SFTResult(run_dir, eval_before, eval_after, metrics)


def held_out_line(metrics: dict[str, float]) -> str:
    """`loss 1.234 (perplexity 3.43), accuracy 0.120`: what a held-out eval measured."""
    parts = []
    if "eval/loss" in metrics:
        parts.append(f"loss {metrics['eval/loss']:.3f} (perplexity {metrics['eval/perplexity']:.2f})")
    if "eval/accuracy" in metrics:
        parts.append(f"accuracy {metrics['eval/accuracy']:.3f}")
    return ", ".join(parts) or "nothing measured"


def said(summary: dict) -> str:
    before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
    if not before or not after:
        return ""
    return f"; held-out {held_out_line(before)} before -> {held_out_line(after)} after (its summary.json)"


def sft(cfg: Config, overwrite: bool = False) -> SFTResult:
    """Fine-tune with `cfg` (`overwrite`: replace the run already in the run's folder), its
    console lines in `trainer.console`'s mode."""
    with console.using(cfg.trainer.console):
        trainer = SFTTrainer(cfg, overwrite)
        try:
            return trainer.fit()
        finally:
            if trainer.workers is not None:
                trainer.workers.close()


__all__ = ["KIND", "SFTResult", "SFTTrainer", "sft"]
