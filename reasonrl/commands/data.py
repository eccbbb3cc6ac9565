"""`reasonrl data prepare gsm8k|math|countdown|piecewise [--input PATH] --output FILE`: task
data files in the layout `data.task=file` reads (`reasonrl.data.prepare`)."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    """The `data` subcommand of the CLI's parser, with its one subcommand `prepare`."""
    d = sub.add_parser("data", help="prepare task data files")
    dsub = d.add_subparsers(dest="data_command", required=True)
    p = dsub.add_parser(
        "prepare", help="convert GSM8K / MATH / Countdown files, or generate Countdown / piecewise problems",
        description="Write {prompt, ground_truth, data_source, extra_info} records as JSONL (or "
                    "Parquet for *.parquet), ready for data.task=file. gsm8k: the official "
                    "question/answer files (the number after #### is the ground truth); math: "
                    "problem/solution(/answer) records, a JSONL/JSON/Parquet file or the official "
                    "folder of JSON files; countdown: with --input, TinyZero's Countdown-Tasks-3to4 "
                    "records (target, nums; JSONL or Parquet), else generated from --seed; piecewise: "
                    "generated from --seed. An option the preparation does not use is an error.")
    p.add_argument("task", choices=["gsm8k", "math", "countdown", "piecewise"])
    p.add_argument("--input", help="source file or folder (gsm8k, math, countdown)")
    p.add_argument("--output", required=True, help="output file: .jsonl or .parquet")
    p.add_argument("--limit", type=int, help="convert at most this many records (default: all)")
    p.add_argument("--skip", type=int, help="convert from this record on, counted from 0 (default 0)")
    p.add_argument("--template", choices=["r1_zero"],
                   help="gsm8k, math: write the prompt in ReasonRL's R1-Zero template (already templated: "
                        "train with data.apply_chat_template=false)")
    p.add_argument("--size", type=int, help="records to generate (countdown without --input, piecewise; "
                                            "default 1000)")
    p.add_argument("--seed", type=int, help="generator seed (countdown without --input, piecewise; "
                                            "default 0)")
    p.add_argument("--instruction", default=None,
                   help="text appended to each question (gsm8k, math; default: the task's usual instruction; "
                        "'' = none)")
    p.set_defaults(func=prepare_command)


def prepare_command(args: argparse.Namespace) -> int:
    from reasonrl.data.prepare import prepare

    count = prepare(args.task, args.output, args.input, limit=args.limit, size=args.size,
                    seed=args.seed, instruction=args.instruction, skip=args.skip, template=args.template)
    print(f"[reasonrl] wrote {count} {args.task} records to {args.output}", flush=True)
    return 0
