"""`reasonrl data prepare gsm8k|math|countdown|piecewise [--input PATH] --output FILE`: task
data files in the layout `data.task=file` reads (`reasonrl.data.prepare`); `reasonrl data traces
RUN|EVAL.json [...] [--min-reward R] [--dedupe] [--out FILE]`: the samples that scored at least R,
as SFT records `reasonrl sft` reads (`reasonrl.sft.traces`)."""

from __future__ import annotations

import argparse

from reasonrl import console


def add_parser(sub) -> None:
    """The `data` subcommand of the CLI's parser, with its subcommands `prepare` and `traces`."""
    d = sub.add_parser("data", help="prepare task data files; a run's good answers as SFT data")
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
    t = dsub.add_parser(
        "traces", help="a run's or an eval's samples that scored at least R, as SFT records",
        description="Write the samples of runs (runs/NAME: its samples.jsonl, trainer.log_samples "
                    "completions a step) or of `reasonrl eval --output` files (every completion) whose "
                    "reward is at least --min-reward, not cut at the token limit, as SFT records ({prompt, "
                    "completion}, or {messages} for multi-turn episodes; with ground_truth, data_source, "
                    "reward and origin) for `reasonrl sft sft.train_path=FILE`: rejection sampling / expert "
                    "iteration, or a teacher's good answers distilled.")
    t.add_argument("sources", nargs="+", metavar="RUN|EVAL.json", help="run directories or eval output files")
    t.add_argument("--min-reward", type=float, default=1.0,
                   help="keep samples whose total reward is at least this (default 1.0: full marks)")
    t.add_argument("--dedupe", action="store_true", help="keep each (prompt, completion) once")
    t.add_argument("--out", help="output file, .jsonl or .parquet (default: traces.jsonl in the first "
                                 "source's folder, or beside the eval file)")
    t.set_defaults(func=traces_command)


def prepare_command(args: argparse.Namespace) -> int:
    from reasonrl.data.prepare import prepare

    count = prepare(args.task, args.output, args.input, limit=args.limit, size=args.size,
                    seed=args.seed, instruction=args.instruction, skip=args.skip, template=args.template)
    console.info(f"wrote {count} {args.task} records to {args.output}", records=count, path=str(args.output))
    return 0


def traces_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from reasonrl.data.readers import write_records
    from reasonrl.errors import DataError
    from reasonrl.sft.traces import collect_traces

    traces, sources = collect_traces(args.sources, args.min_reward, args.dedupe)
    if not traces.records:
        raise DataError(f"no sample of {', '.join(args.sources)} scored at least --min-reward="
                        f"{args.min_reward:g} ({traces.samples} read, {traces.truncated} of those that did "
                        "were cut at the token limit): nothing to write")
    first = Path(args.sources[0])
    out = Path(args.out) if args.out else (first / "traces.jsonl" if first.is_dir()
                                           else first.with_name(f"{first.stem}.traces.jsonl"))
    write_records(traces.records, out)
    dropped = f", {traces.duplicates} duplicates dropped" if args.dedupe else ""
    console.info(f"wrote {len(traces.records)} SFT records to {out}: {traces.passed} of {traces.samples} "
                 f"samples scored at least {args.min_reward:g} (and {traces.truncated} more cut at the token "
                 f"limit, left out){dropped}", records=len(traces.records), path=str(out))
    for source in sources:
        for note in source.notes:
            console.info(f"{source.path}: {note}", label="note: ")
    return 0
