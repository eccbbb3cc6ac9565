"""Command line: `reasonrl train [CONFIG.yaml] [dotted.key=value ...]`."""

from __future__ import annotations

import argparse
import sys

import reasonrl  # noqa: F401  (sets OMP_WAIT_POLICY before torch is imported)
from reasonrl.config import ConfigError, load_config
from reasonrl.data import DataError
from reasonrl.policy.model import ModelLoadError


def _train(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    config = args.config
    if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
        overrides.insert(0, config)  # `reasonrl train trainer.steps=3`: no file given
        config = None
    cfg = load_config(config, overrides)
    if args.print_config:
        from reasonrl.config import dump_yaml

        print(dump_yaml(cfg), end="")
        return 0
    from reasonrl.trainer import train

    train(cfg)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reasonrl",
        description="GRPO-family reinforcement learning for language models on checkable tasks.")
    sub = parser.add_subparsers(dest="command", required=True)
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
    p.set_defaults(func=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    # argparse stops filling `overrides` at the first option: `train c.yaml --flag a.b=1`
    # leaves `a.b=1` unparsed; anything else unknown is a real error.
    bad = [a for a in rest if "=" not in a or a.startswith("-")]
    if bad or (rest and args.command != "train"):
        parser.error(f"unrecognized arguments: {' '.join(bad or rest)}")
    if rest:
        args.overrides = [*args.overrides, *rest]
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"reasonrl: config error: {err}", file=sys.stderr)
        return 2
    except (DataError, ModelLoadError, FileExistsError) as err:
        print(f"reasonrl: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("reasonrl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
