"""`reasonrl train [CONFIG.yaml] [dotted.key=value ...]`: resolve the config (a file, the
overrides, `--resume`'s run, `--allow-config-change`) and train, or print it."""

from __future__ import annotations

import argparse
import sys

from reasonrl.config import load_config
from reasonrl.errors import ConfigError


def add_parser(sub) -> None:
    """The `train` subcommand of the CLI's parser."""
    p = sub.add_parser(
        "train", help="train a policy",
        description="Train with CONFIG.yaml (default: built-in defaults) and dotted overrides, "
                    "e.g. `reasonrl train configs/smoke.yaml trainer.steps=3 optim.lr=1e-5`. "
                    "Writes runs/<name>/ (config.yaml, metrics.jsonl, samples.jsonl, "
                    "checkpoints/step_N/huggingface).")
    p.add_argument("config", nargs="?", help="YAML config file")
    p.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config and exit")
    p.add_argument("--resume", metavar="RUN",
                   help="continue runs/NAME (or one of its checkpoints/step_N) from its newest "
                        "complete checkpoint, with the run's config.yaml unless CONFIG is given")
    p.add_argument("--allow-config-change", metavar="KEYS",
                   help="comma-separated dotted keys a resume may change, e.g. trainer.steps")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in a run folder that already holds a run (trainer.run_name): its "
                        "logs, checkpoints and report are deleted first")
    p.set_defaults(func=train_command)


def train_command(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    config = args.config
    if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
        overrides.insert(0, config)  # `reasonrl train trainer.steps=3`: no file given
        config = None
    if args.overwrite and (args.resume or any(o.startswith("trainer.resume=") for o in overrides)):
        raise ConfigError("--overwrite starts the run over and --resume continues it: give one of them")
    if args.resume:
        from pathlib import Path

        run = Path(args.resume)
        run = run.parent.parent if run.parent.name == "checkpoints" else run
        if config is None:  # the run's own resolved config
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
    from reasonrl.train.trainer import train

    try:
        train(cfg, overwrite=args.overwrite)
    except TrainingInterrupted as stop:
        print(f"reasonrl: {stop}", file=sys.stderr, flush=True)
        return stop.exit_code
    except TrainingAborted as err:
        print(f"reasonrl: error: {err}", file=sys.stderr, flush=True)
        return 1
    return 0
