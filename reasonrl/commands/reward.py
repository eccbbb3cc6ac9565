"""`reasonrl reward --task T --ground-truth GT "completion"` | `reasonrl reward --file F.jsonl`:
score completions with the trainer's own reward code, to debug a reward rule."""

from __future__ import annotations

import argparse
import json

from reasonrl.config import load_config
from reasonrl.errors import ConfigError, DataError
from reasonrl.registry import VERIFIERS


def add_parser(sub) -> None:
    """The `reward` subcommand of the CLI's parser."""
    p = sub.add_parser(
        "reward", help="score completions with a task's reward, to debug a reward rule",
        description="Print the score and its components as JSON: one line for the completion "
                    "given, or one line per record of --file (fields completion, ground_truth, "
                    "optional task, data_source, extra_info, prompt) and a summary line. Tasks: "
                    + "; ".join(f"{e.name}: {e.doc}" for e in VERIFIERS))
    p.add_argument("completion", nargs="?", help="the completion text to score")
    p.add_argument("--task", choices=["auto", *VERIFIERS.names()], help="the verifier (default: reward.task)")
    p.add_argument("--ground-truth", help="the ground truth (countdown/piecewise: JSON)")
    p.add_argument("--extra-info", help="extra_info JSON object passed to the verifier")
    p.add_argument("--prompt", default="", help="the question the completion answers (read by reward.model: "
                   "the judge and the classifier of reward.weights)")
    p.add_argument("--file", help="JSONL of {completion, ground_truth, task?} records")
    p.add_argument("--fn", help="custom reward module:function (reward.fn)")
    p.add_argument("--timeout", type=float, help="seconds per sample for math / reward.fn")
    p.add_argument("--config", help="a train config whose reward section to use (weights, task)")
    p.set_defaults(func=reward_command)


def reward_records(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """(where, record) pairs to score: the one on the command line, or each line of --file."""
    if args.file is None:
        if args.completion is None or args.ground_truth is None:
            raise ConfigError("reward: give a completion and --ground-truth, or --file F.jsonl")
        extra = json.loads(args.extra_info) if args.extra_info else {}
        return [("command line", {"completion": args.completion, "ground_truth": args.ground_truth,
                                  "extra_info": extra, "prompt": args.prompt})]
    from reasonrl.data.readers import iter_records

    records = []
    for where, record in iter_records(args.file):
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
        for key in ("completion", "ground_truth"):
            if not isinstance(record.get(key), (str, int, float)) or isinstance(record.get(key), bool):
                raise DataError(f"{where}: field '{key}' must be a string")
        if not isinstance(record.get("extra_info", {}), dict):
            raise DataError(f"{where}: field 'extra_info' must be an object")
        if not isinstance(record.get("prompt", ""), (str, list)):
            raise DataError(f"{where}: field 'prompt' must be a string or a list of chat messages")
        records.append((where, record))
    return records


def reward_command(args: argparse.Namespace) -> int:
    """Score completions with the trainer's own reward code and print JSON lines."""
    from reasonrl.placement import build_workers

    overrides = [f"reward.{k}={v}" for k, v in (("task", args.task), ("fn", args.fn),
                                                ("timeout", args.timeout)) if v is not None]
    full = load_config(args.config, overrides)
    cfg = full.reward
    # a judge or classifier in reward.weights: the judge role, built as a run builds it (alone)
    workers = build_workers(full, roles=("judge",))
    try:
        rows = _score_records(args, cfg, workers.judge)
    finally:
        workers.close()
    if args.file:
        n = len(rows)
        print(json.dumps({"summary": {
            "records": n, "score_mean": sum(r["score"] for r in rows) / max(n, 1),
            "solved": sum(r["components"]["correct"] >= 1.0 for r in rows),
            "timeouts": sum(r["timeout"] for r in rows),
            "errors": sum(r["error"] is not None for r in rows)}}), flush=True)
    return 0


def _score_records(args: argparse.Namespace, cfg, judge) -> list[dict]:
    """Each record scored and printed as one JSON line (see `reward_command`)."""
    import dataclasses

    from reasonrl.batch import Example
    from reasonrl.rewards import score_examples, verifier_for
    from reasonrl.rewards.failures import describe_verifier

    rows = []
    for where, record in reward_records(args):
        task = record.get("task") or cfg.task
        if task != "auto" and task not in VERIFIERS:
            raise DataError(f"{where}: field 'task': unknown task {task!r}; allowed: "
                            f"{', '.join(VERIFIERS.names())}")
        row_cfg = dataclasses.replace(cfg, task=task)
        example = Example(prompt=record.get("prompt", ""), ground_truth=str(record["ground_truth"]),
                          data_source=str(record.get("data_source") or "numeric"),
                          meta={**record.get("extra_info", {}), "origin": where})
        result = score_examples([str(record["completion"])], [example], row_cfg, always_correct=True,
                                judge=judge)
        verifier = verifier_for(example.data_source, row_cfg)
        failure = None if result.timed_out[0] else result.failures[0]  # printed without the function
        row = {"task": verifier.task, "score": result.total[0].item(),
               "components": {k: v[0].item() for k, v in result.components.items()},
               "parts": result.parts[0], "timeout": result.timed_out[0],
               "error": failure and failure.removeprefix(f"{describe_verifier(verifier)}: ")}
        print(json.dumps({"where": where, **row} if args.file else row), flush=True)
        rows.append(row)
    return rows
