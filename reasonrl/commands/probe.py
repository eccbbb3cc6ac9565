"""`reasonrl probe [--config C] [--model M] [--data FILE|TASK]`: will GRPO learn here? Accuracy,
reward variance, entropy and a verdict, with training's sampling."""

from __future__ import annotations

import argparse

from reasonrl import console
from reasonrl.commands.evaluation import add_options, run, settings_from_options, write_json
from reasonrl.errors import ConfigError
from reasonrl.tracking import counted


def add_parser(sub) -> None:
    """The `probe` subcommand of the CLI's parser."""
    p = sub.add_parser(
        "probe", help="will GRPO learn here? accuracy, reward variance, entropy and a verdict",
        description="Sample rollout.n completions per prompt (training's sampling) and report "
                    "accuracy, mean per-prompt reward variance, the share of prompts whose rewards "
                    "are all equal (all right, all wrong), and entropy, with a verdict: accuracy "
                    "10-80%, variance > 0.05; too hard -> SFT first or easier data, too easy -> harder "
                    "data, low variance -> keep the prompts the model sometimes solves. Entropy outside "
                    "0.2-0.8 nats is a note, not a verdict.")
    add_options(p, probe=True)
    p.add_argument("--accuracy-range", default="0.1,0.8", metavar="LOW,HIGH",
                   help="accuracy GRPO learns from (default 0.1,0.8)")
    p.add_argument("--min-variance", type=float, default=0.05,
                   help="mean per-prompt reward variance must exceed this (default 0.05)")
    p.add_argument("--entropy-range", default="0.2,0.8", metavar="LOW,HIGH",
                   help="mean token entropy in nats outside which the probe adds a note (default 0.2,0.8)")
    p.set_defaults(func=probe_command)


def probe_command(args: argparse.Namespace) -> int:
    from reasonrl.evaluate import ProbeThresholds, format_verdict, probe_report

    def bounds(text: str, option: str) -> tuple[float, float]:
        try:
            low, high = (float(x) for x in text.split(","))
        except ValueError:
            raise ConfigError(f"{option}: expected LOW,HIGH like 0.1,0.8, got {text!r}") from None
        if low > high:
            raise ConfigError(f"{option}: LOW {low} is above HIGH {high}")
        return low, high

    (min_acc, max_acc), (min_ent, max_ent) = (bounds(args.accuracy_range, "--accuracy-range"),
                                              bounds(args.entropy_range, "--entropy-range"))
    thresholds = ProbeThresholds(min_accuracy=min_acc, max_accuracy=max_acc, min_variance=args.min_variance,
                                 min_entropy=min_ent, max_entropy=max_ent)
    cfg, settings = settings_from_options(args, probe=True)
    results, record = run(cfg, settings, args.data, desc="probe")
    report = probe_report(results, record, thresholds)
    t = report["times"]
    console.info(f"probe of {report['model']} on {report['settings']['data']}: "
                 f"{counted(len(results), 'prompt')} x {counted(settings.n, 'sample')} at "
                 f"T={settings.temperature:g}, wall {t['wall_s']:.1f} s")
    print(format_verdict(report), flush=True)
    if args.output:
        write_json(args.output, report)
    return 0
