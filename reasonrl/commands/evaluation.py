"""What `reasonrl eval` and `reasonrl probe` share: their options, the examples they read,
the workers they build and the run itself.

This is the part of the evaluation that builds workers (`placement.build_workers`, as
training does, so whatever `rollout.engine` the config names generates here too), so it sits
above placement, beside the trainer; the loop itself (`reasonrl.evaluate.evaluate`) needs
only the worker protocols. The options fill the config's `eval` section, the one form of the
evaluation's settings (`evaluate.eval_settings` resolves it), so `reasonrl eval` and the
trainer's held-out eval cannot disagree.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from reasonrl import console
from reasonrl.config import Config, EvalConfig, TeacherConfig, WorkerPlacement, load_config
from reasonrl.errors import ConfigError, DataError
from reasonrl.registry import DATA_TASKS, VERIFIERS

if TYPE_CHECKING:  # the evaluation and the data readers load when a command runs, not for --help
    from reasonrl.batch import Example
    from reasonrl.evaluate import EvalSettings, PromptResult


def add_options(p: argparse.ArgumentParser, probe: bool) -> None:
    """The options `eval` and `probe` share; `probe` names the rollout section's defaults."""
    p.add_argument("overrides", nargs="*", help="dotted.key=value config overrides (e.g. rollout.engine=hf)")
    p.add_argument("--config", help="a train config: its model, data, rollout and reward sections are used")
    p.add_argument("--model", help="model.path: an HF folder, runs/X/checkpoints/step_N, a Hub id org/name "
                                   "(from the Hugging Face cache), `tiny`, or '' for the embedded "
                                   "SmolLM2-135M-Instruct (default: the config's)")
    p.add_argument("--data", help="a data file (JSONL/JSON/Parquet; comma-separated for several) or a "
                                  "built-in task (arithmetic, countdown, piecewise) = its held-out split; "
                                  "default: the config's held-out set")
    p.add_argument("--task", choices=["auto", *VERIFIERS.names()],
                   help="the verifier (reward.task; default auto = from each record's data_source)")
    section = "rollout" if probe else "eval"
    p.add_argument("--n", type=int, help=f"samples per prompt (default: {section}.n; 1 with --greedy)")
    if not probe:
        p.add_argument("--k", help="pass@k values, comma-separated (default: eval.k, else 1,n); a record's "
                                   "extra_info.pass@k adds its own")
    p.add_argument("--greedy", action="store_true", help="argmax decoding (n = 1)")
    p.add_argument("--temperature", type=float,
                   help=f"sampling temperature (default: {section}.temperature" + (
                       "; 0 = greedy; with --n > 1 and a greedy eval section: rollout.temperature)"
                       if not probe else ")"))
    p.add_argument("--top-p", type=float, help=f"nucleus sampling (default: {section}.top_p)")
    p.add_argument("--top-k", type=int, help=f"top-k sampling, 0 = off (default: {section}.top_k)")
    p.add_argument("--max-new-tokens", type=int,
                   help="default: " + ("rollout.max_new_tokens" if probe else
                                       "eval.max_new_tokens, else rollout.max_new_tokens"))
    p.add_argument("--limit", type=int, default=0, help="at most this many prompts (0 = all)")
    p.add_argument("--batch-size", type=int, default=64, help="sequences per generate call")
    p.add_argument("--no-entropy", action="store_true", help="skip the entropy forward pass")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--output", "-o", help="write the metrics (and every completion) to this JSON file")


def settings_from_options(args: argparse.Namespace, probe: bool) -> tuple[Config, EvalSettings]:
    """(config, EvalSettings) from the eval / probe options.

    eval: the options fill the config's `eval` section, the one the trainer's held-out eval
    uses (`evaluate.eval_settings`), so an option left out takes the section's value: --n
    (eval.n), --greedy (eval.temperature=0, n 1), --temperature, --top-p, --top-k, --k,
    --max-new-tokens. --n > 1 without --temperature on a greedy section samples at
    rollout.temperature. probe: training's sampling (the rollout section: n, temperature,
    top-p, top-k, max_new_tokens) with the same options on top, without records' own n."""
    from reasonrl.evaluate import eval_settings

    overrides = list(args.overrides)
    if args.model is not None:
        overrides.append(f"model.path={args.model}")
    if args.task is not None:
        overrides.append(f"reward.task={args.task}")
    cfg = load_config(args.config, overrides)
    r, ev = cfg.rollout, cfg.eval
    base = (r.n, r.temperature, r.top_p, r.top_k, r.max_new_tokens) if probe else (
        ev.n, ev.temperature, ev.top_p, ev.top_k, ev.max_new_tokens)
    n = args.n if args.n is not None else (1 if args.greedy else base[0])
    if args.greedy:
        temperature = 0.0
    elif args.temperature is not None:
        temperature = args.temperature
    else:
        temperature = r.temperature if base[1] == 0 and n > 1 else base[1]
    ks: list[int] = []
    if getattr(args, "k", None):
        try:
            ks = sorted({int(k) for k in args.k.split(",") if k.strip()})
        except ValueError:
            raise ConfigError(f"--k: expected comma-separated integers like 1,4,16, got {args.k!r}") from None
    elif not probe and args.n is None:
        ks = list(ev.k)
    section = EvalConfig(n=n, temperature=temperature, k=ks,
                         top_p=args.top_p if args.top_p is not None else base[2],
                         top_k=args.top_k if args.top_k is not None else base[3],
                         max_new_tokens=args.max_new_tokens if args.max_new_tokens is not None else base[4])
    options = dict(limit=args.limit, batch_size=args.batch_size, entropy=not args.no_entropy,
                   progress=not args.no_progress, record_overrides=not probe)
    settings = eval_settings(dataclasses.replace(cfg, eval=section), **options)
    check_options(settings)
    if not probe:
        cfg = dataclasses.replace(cfg, eval=section)
    return cfg, settings


def check_options(settings: EvalSettings) -> None:
    """The options' values, each error naming its option (the trainer's `eval` section is
    checked by the config, key by key)."""
    if settings.n < 1:
        raise ConfigError(f"--n: must be >= 1, got {settings.n}")
    if settings.greedy and settings.n != 1:
        raise ConfigError(f"--greedy: greedy samples of a prompt are identical; use --n 1, got {settings.n}")
    for k in settings.ks:
        if not 1 <= k <= settings.n:
            raise ConfigError(f"--k: pass@{k} needs 1 <= k <= n = {settings.n} samples per prompt")
    if settings.temperature <= 0:
        raise ConfigError(f"--temperature: must be > 0, got {settings.temperature}")
    if not 0 < settings.top_p <= 1 or settings.top_k < 0:
        raise ConfigError(f"--top-p must be in (0, 1] and --top-k >= 0, got {settings.top_p}, "
                          f"{settings.top_k}")
    if settings.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens: must be >= 1, got {settings.max_new_tokens}")
    if settings.limit < 0 or settings.batch_size < 1:
        raise ConfigError("--limit must be >= 0 and --batch-size >= 1")


def load_eval_examples(cfg: Config, data: str | None, limit: int = 0) -> tuple[list[Example], str]:
    """(examples, what they are). `data`: a file (JSONL/JSON/Parquet/CSV/`datasets` folder) or a
    Hub dataset id (with `data.val_subset`, `data.val_split`, `data.format`), several
    comma-separated; a built-in task name (its held-out split, from the config's section for
    that task), or None for the config's own held-out set."""
    from reasonrl.data import load_examples, load_files, take_per_source
    from reasonrl.data.readers import is_hub_id
    from reasonrl.data.tasks import prompt_budget

    seed = cfg.trainer.seed
    if data is None:
        if not DATA_TASKS[cfg.data.task].generated:  # only the held-out files: no training set needed
            if not cfg.data.val_path:
                raise DataError("the config has no held-out set (data.val_path is empty): pass --data FILE")
            d = cfg.data
            examples = load_files(d.val_path, d.fields, d.val_subset, d.val_split, d.format, prompt_budget(d))
            examples = take_per_source(examples, d.val_size) if d.val_size else examples
        else:
            examples = load_examples(cfg.data, seed)[1]
            if not examples:
                raise DataError(f"data.task={cfg.data.task} has no held-out set: pass --data FILE")
        what = f"held-out set of data.task={cfg.data.task}"
        what += f" ({cfg.data.val_path})" if cfg.data.val_path else ""
    elif data in DATA_TASKS and DATA_TASKS[data].generated:
        d = dataclasses.replace(cfg.data, task=data, val_size=0)
        examples = load_examples(d, seed)[1]
        what = f"{data} held-out split (seed {seed})"
    elif all(Path(p.strip()).exists() or is_hub_id(p.strip()) for p in data.split(",") if p.strip()):
        d = cfg.data  # a Hub id takes the config's held-out subset, split and format
        examples = load_files(data, d.fields, d.val_subset, d.val_split, d.format, prompt_budget(d))
        what = data
    else:
        generated = [e.name for e in DATA_TASKS if e.generated]
        raise DataError(f"--data {data}: no such file, and not a built-in task ({', '.join(generated)})")
    if limit:
        examples = take_per_source(examples, limit)
    return examples, what


def _without_teacher(cfg: Config) -> Config:
    """`cfg` without a teacher (teacher.path, placement.teacher): an evaluation samples and scores
    the policy alone, so a distillation run's config neither loads its teacher nor needs it."""
    return dataclasses.replace(cfg, teacher=TeacherConfig(),
                               placement=dataclasses.replace(cfg.placement, teacher=WorkerPlacement()))


def _eval_config(cfg: Config, s: EvalSettings) -> Config:
    """The config the workers are built from: the run's model, data and engine settings with
    the evaluation's sampling, and no reference model (nothing here needs one)."""
    return dataclasses.replace(
        cfg, algo=dataclasses.replace(cfg.algo, beta=0.0, log_kl=False),
        rollout=dataclasses.replace(cfg.rollout, n=s.n, temperature=s.temperature, top_p=s.top_p,
                                    top_k=s.top_k, max_new_tokens=s.max_new_tokens))


def run(cfg: Config, settings: EvalSettings, data: str | None = None,
        desc: str = "eval") -> tuple[list[PromptResult], dict]:
    """`reasonrl eval` / `probe`: build the workers as training does (`build_workers`, so
    whatever `rollout.engine` the config names generates here too), check that the engine
    serves the policy's weights, and `evaluate`.

    Returns the per-prompt results and a record {data, settings, model, times, prompts} where
    `prompts` holds every prompt's completions, rewards and answers.
    """
    import torch

    from reasonrl.data import system_prompt_for
    from reasonrl.evaluate import evaluate, record_plan
    from reasonrl.placement import build_workers, preflight
    from reasonrl.rewards import check_examples, verifier_for
    from reasonrl.rng import seed_everything
    from reasonrl.rollout import check_prompt_lengths
    from reasonrl.train.choices import decide, warn_slow_precision

    with console.using(cfg.trainer.console):  # the run's lines in trainer.console's mode
        cfg = _without_teacher(cfg)
        preflight(cfg)
        warn_slow_precision(cfg)
        t_start = time.perf_counter()
        torch.set_num_threads(cfg.trainer.threads or os.cpu_count() or 1)
        examples, what = load_eval_examples(cfg, data, settings.limit)
        check_examples(examples, cfg.reward)
        record_plan(examples, settings)  # a record's bad extra_info.n / pass@k fails before the model loads
        cfg = decide(_eval_config(cfg, settings))  # the decoder, precision, budget: once, said
        t = time.perf_counter()
        workers = build_workers(cfg)
        try:
            # The engine must serve exactly the policy's weights: the entropy pass reads the policy.
            workers.sync.push(0)  # checked as the trainer's pushes are (ray mode: actor to actor)
            seed_everything(cfg.trainer.seed)
            load_s = time.perf_counter() - t
            check_prompt_lengths(workers.rollout, examples, cfg.data.max_prompt_tokens)  # all of them, now
            evaluation = evaluate(workers.rollout, workers.policy, examples, settings, cfg.reward, desc=desc,
                                  judge=workers.judge)
        finally:
            workers.close()
    times = {"load_s": load_s, **evaluation.times, "wall_s": time.perf_counter() - t_start}
    generated = sum(sum(r.lengths) for r in evaluation.results)
    times["generated_tokens_per_s"] = generated / max(times["generate_s"], 1e-9)
    record = {
        "model": cfg.model.path or "SmolLM2-135M-Instruct (embedded default)",
        "engine": cfg.rollout.engine,
        "settings": {"data": what, **{k: v for k, v in dataclasses.asdict(settings).items()
                                      if k not in ("progress",)},
                     "entropy_temperature": 1.0 if settings.greedy else settings.temperature,
                     "seed": cfg.trainer.seed, "reward_weights": dict(cfg.reward.weights),
                     # how the prompts were rendered, for `reasonrl data traces` to write them as they were
                     "system_prompt": system_prompt_for(cfg.data),
                     "apply_chat_template": cfg.data.apply_chat_template,
                     "observation_format": cfg.env.observation_format,
                     "tasks": {e.data_source: verifier_for(e.data_source, cfg.reward).task
                               for e in examples}},
        "times": times,
        "prompts": evaluation.prompts,
    }
    record["settings"]["ks"] = list(settings.ks)
    return evaluation.results, record


def write_json(path: str, report: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1) + "\n")
    console.info(f"wrote {path}", path=str(path))
