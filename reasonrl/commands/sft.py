"""`reasonrl sft [CONFIG.yaml] [dotted.key=value ...]`: supervised fine-tuning with `train`'s
config, options and run directory (`reasonrl.sft`); its checkpoint starts RL with
`reasonrl train CONFIG model.path=runs/<name>/checkpoints/step_N`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reasonrl.config import load_config
from reasonrl.errors import ConfigError


def add_parser(sub) -> None:
    """The `sft` subcommand of the CLI's parser."""
    p = sub.add_parser(
        "sft", help="supervised fine-tuning (its checkpoint starts RL)",
        description="Fine-tune with CONFIG.yaml and dotted overrides on {prompt, completion} or {messages} "
                    "records (sft.train_path; or sft.source=solver: the task's problems with worked "
                    "solutions), e.g. `reasonrl sft configs/sft.yaml trainer.steps=50`. The loss is on the "
                    "completion (assistant turns) only. Writes runs/<name>/ like `train` (config.yaml, "
                    "metrics.jsonl, checkpoints/step_N/huggingface, report.html); RL from it: "
                    "`reasonrl train CONFIG model.path=runs/<name>/checkpoints/step_N`.")
    p.add_argument("config", nargs="?", help="YAML config file")
    p.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--resume", metavar="RUN",
                   help="continue runs/NAME (or one of its checkpoints/step_N) from its newest complete "
                        "checkpoint, with the run's config.yaml unless CONFIG is given")
    p.add_argument("--allow-config-change", metavar="KEYS",
                   help="comma-separated dotted keys a resume may change, e.g. trainer.steps")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in a run folder that already holds a run (trainer.run_name): its "
                        "logs, checkpoints and report are deleted first")
    p.set_defaults(func=sft_command)


def sft_command(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    config = args.config
    if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
        overrides.insert(0, config)  # `reasonrl sft sft.train_path=x.jsonl`: no file given
        config = None
    if args.overwrite and (args.resume or any(o.startswith("trainer.resume=") for o in overrides)):
        raise ConfigError("--overwrite starts the run over and --resume continues it: give one of them")
    if args.resume:
        run = Path(args.resume)
        run = run.parent.parent if run.parent.name == "checkpoints" else run
        if config is None:
            if not (run / "config.yaml").is_file():
                raise ConfigError(f"--resume {args.resume}: no run there ({run}/config.yaml is missing)")
            config = str(run / "config.yaml")
        overrides.append(f"trainer.resume={args.resume}")
    if args.allow_config_change:
        keys = [k.strip() for k in args.allow_config_change.split(",") if k.strip()]
        overrides.append(f"trainer.allow_config_change=[{', '.join(keys)}]")
    cfg = load_config(config, overrides)
    if args.print_config:
        from reasonrl.config import dump_yaml

        print(dump_yaml(cfg), end="")
        return 0
    from reasonrl.errors import TrainingAborted, TrainingInterrupted
    from reasonrl.sft.trainer import sft

    try:
        sft(cfg, overwrite=args.overwrite)
    except TrainingInterrupted as stop:
        where = ("no checkpoint was written yet; the run must start again" if stop.checkpoint is None
                 else f"checkpoint {stop.checkpoint}; resume with: reasonrl sft --resume {stop.run_dir}")
        print(f"reasonrl: stopped by {stop.signal_name} after step {stop.step}: {where}", file=sys.stderr,
              flush=True)
        return stop.exit_code
    except TrainingAborted as err:
        print(f"reasonrl: error: {err}", file=sys.stderr, flush=True)
        return 1
    return 0
