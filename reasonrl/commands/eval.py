"""`reasonrl eval [--config C] [--model M] [--data FILE|TASK] [--n 16 --k 1,4,16] [--output F.json]`:
pass@k, majority vote, entropy and lengths per data source, as a table and a JSON report,
compared with an earlier one (`--compare`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from reasonrl import console
from reasonrl.commands.evaluation import add_options, run, settings_from_options, write_json
from reasonrl.errors import DataError
from reasonrl.tracking import counted


def add_parser(sub) -> None:
    """The `eval` subcommand of the CLI's parser."""
    p = sub.add_parser(
        "eval", help="evaluate a model: pass@k, majority vote, entropy, lengths, per data source",
        description="Sample --n completions per prompt with the config's rollout engine and report, "
                    "per data_source and overall: mean reward, pass@1, unbiased pass@k (Chen et al. "
                    "2021), majority-vote accuracy, mean token entropy, response length mean/p95, "
                    "truncated fraction and format-error rate. Prints a table, writes --output JSON; "
                    "--compare BASE.json prints BASE -> this side by side with deltas.")
    add_options(p, probe=False)
    p.add_argument("--compare", metavar="OTHER.json", help="an earlier `reasonrl eval --output` file")
    p.set_defaults(func=eval_command)


def eval_command(args: argparse.Namespace) -> int:
    from reasonrl.evaluate import compare_deltas, eval_report, format_compare, format_table

    base = None
    if args.compare:  # read it first: a bad file fails before the model runs
        try:
            base = json.loads(Path(args.compare).read_text())
            assert isinstance(base, dict) and isinstance(base.get("overall"), dict)
        except (OSError, ValueError, AssertionError):
            raise DataError(f"--compare {args.compare}: not a JSON file written by `reasonrl eval`") from None
    cfg, settings = settings_from_options(args, probe=False)
    results, record = run(cfg, settings, args.data)
    report = eval_report(results, record, settings.ks)
    t = report["times"]
    console.info(f"eval of {report['model']} on {report['settings']['data']}: "
                 f"{counted(len(results), 'prompt')} x {settings.n} "
                 f"{'greedy' if settings.greedy else 'sampled'}, "
                 f"wall {t['wall_s']:.1f} s (generate {t['generate_s']:.1f}, entropy {t['entropy_s']:.1f}, "
                 f"reward {t['reward_s']:.1f})")
    print(format_table(report), flush=True)
    if base is not None:
        report["compare"] = {"base": args.compare, "deltas": compare_deltas(base, report)}
        console.info(f"{args.compare} -> this evaluation")
        print(format_compare(base, report, Path(args.compare).stem, "this"), flush=True)
    if args.output:
        write_json(args.output, report)
    return 0
