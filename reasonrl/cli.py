"""Command line.

    reasonrl train [CONFIG.yaml] [dotted.key=value ...]
    reasonrl data prepare gsm8k|math|countdown|piecewise [--input PATH] --output FILE
    reasonrl reward --task T --ground-truth GT "completion"   |   reasonrl reward --file F.jsonl
    reasonrl tool calculator|python 'ARGS' [--timeout S] [--memory-mb N] [--disk-mb N] [--sandbox MODE]
    reasonrl report RUN [RUN ...] [-o report.html]
    reasonrl eval  [--config C] [--model M] [--data FILE|TASK] [--n 16 --k 1,4,16] [--output F.json]
    reasonrl probe [--config C] [--model M] [--data FILE|TASK]

Every failure ends in one line on stderr, `reasonrl: error: ...` (`reasonrl: config error: ...`
for a configuration key) naming what happened and what to do, with exit code 2 when the input
is at fault (config, data, run directory, disk, the machine's sandbox) and 1 when the run
itself failed (training aborted, or an error reasonrl did not expect). No traceback, unless
`--debug` (before or after the command) or the environment variable REASONRL_DEBUG=1 asks for
one: then the traceback comes first and the same line last, with the same exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import reasonrl  # noqa: F401  (sets OMP_WAIT_POLICY before torch is imported)
from reasonrl.config import load_config
from reasonrl.errors import (
    ConfigError,
    DataError,
    GroundTruthError,
    MissingExtraError,
    ModelLoadError,
    PlacementError,
    ReasonRLError,
    ReportError,
    SandboxError,
    TrainingAborted,
)
from reasonrl.eval_command import add_commands
from reasonrl.registry import VERIFIERS


def _train(args: argparse.Namespace) -> int:
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
    from reasonrl.trainer import train

    try:
        train(cfg, overwrite=args.overwrite)
    except TrainingInterrupted as stop:
        print(f"reasonrl: {stop}", file=sys.stderr, flush=True)
        return stop.exit_code
    except TrainingAborted as err:
        print(f"reasonrl: error: {err}", file=sys.stderr, flush=True)
        return 1
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from reasonrl.data.prepare import prepare

    count = prepare(args.task, args.output, args.input, limit=args.limit, size=args.size,
                    seed=args.seed, instruction=args.instruction, skip=args.skip, template=args.template)
    print(f"[reasonrl] wrote {count} {args.task} records to {args.output}", flush=True)
    return 0


def _reward_records(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """(where, record) pairs to score: the one on the command line, or each line of --file."""
    if args.file is None:
        if args.completion is None or args.ground_truth is None:
            raise ConfigError("reward: give a completion and --ground-truth, or --file F.jsonl")
        extra = json.loads(args.extra_info) if args.extra_info else {}
        return [("command line", {"completion": args.completion, "ground_truth": args.ground_truth,
                                  "extra_info": extra})]
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
        records.append((where, record))
    return records


def _report(args: argparse.Namespace) -> int:
    from reasonrl.report import write_report

    path = write_report(args.runs, args.output)
    print(f"[reasonrl] wrote {path}", flush=True)
    return 0


def _reward(args: argparse.Namespace) -> int:
    """Score completions with the trainer's own reward code and print JSON lines."""
    import dataclasses

    from reasonrl.batch import Example
    from reasonrl.rewards import score_examples, verifier_for
    from reasonrl.rewards.failures import describe_verifier

    overrides = [f"reward.{k}={v}" for k, v in (("task", args.task), ("fn", args.fn),
                                                ("timeout", args.timeout)) if v is not None]
    cfg = load_config(args.config, overrides).reward
    rows = []
    for where, record in _reward_records(args):
        task = record.get("task") or cfg.task
        if task != "auto" and task not in VERIFIERS:
            raise DataError(f"{where}: field 'task': unknown task {task!r}; allowed: "
                            f"{', '.join(VERIFIERS.names())}")
        row_cfg = dataclasses.replace(cfg, task=task)
        example = Example(prompt="", ground_truth=str(record["ground_truth"]),
                          data_source=str(record.get("data_source") or "numeric"),
                          meta={**record.get("extra_info", {}), "origin": where})
        result = score_examples([str(record["completion"])], [example], row_cfg, always_correct=True)
        verifier = verifier_for(example.data_source, row_cfg)
        failure = None if result.timed_out[0] else result.failures[0]  # printed without the function
        row = {"task": verifier.task, "score": result.total[0].item(),
               "components": {k: v[0].item() for k, v in result.components.items()},
               "parts": result.parts[0], "timeout": result.timed_out[0],
               "error": failure and failure.removeprefix(f"{describe_verifier(verifier)}: ")}
        print(json.dumps({"where": where, **row} if args.file else row), flush=True)
        rows.append(row)
    if args.file:
        n = len(rows)
        print(json.dumps({"summary": {
            "records": n, "score_mean": sum(r["score"] for r in rows) / max(n, 1),
            "solved": sum(r["components"]["correct"] >= 1.0 for r in rows),
            "timeouts": sum(r["timeout"] for r in rows),
            "errors": sum(r["error"] is not None for r in rows)}}), flush=True)
    return 0


def _tool(args: argparse.Namespace) -> int:
    """Run one tool call through the sandbox training uses and print its observation as JSON."""
    from reasonrl.errors import SandboxError
    from reasonrl.registry import TOOLS
    from reasonrl.tools import Limits, call_tool, sandbox_plan

    text = sys.stdin.read() if args.arguments == "-" else args.arguments
    arguments: str | dict = text
    if text.lstrip().startswith("{"):  # a chat template's tool call: {"code": "..."}
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            arguments = parsed
    chosen = {"timeout": args.timeout, "memory_mb": args.memory_mb, "disk_mb": args.disk_mb,
              "sandbox": args.sandbox}
    limits = Limits(**{k: v for k, v in chosen.items() if v is not None})
    mode = "parse (no code runs)"
    if TOOLS[args.name].info.get("sandboxed"):  # probed before the call: its seconds are its own
        try:
            mode = sandbox_plan(limits.sandbox, limits.uid, limits.python).mode
        except SandboxError:  # the observation's error says why
            mode = "unavailable"
    observation = call_tool(args.name, arguments, limits)
    shown = {**observation.to_dict(), "seconds": round(observation.seconds, 4)}
    print(json.dumps({"tool": args.name, **shown, "mode": mode}), flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reasonrl",
        description="GRPO-family reinforcement learning for language models on checkable tasks.")
    # main() takes --debug out of the arguments wherever it stands; declared here for --help
    parser.add_argument("--debug", action="store_true",
                        help=f"on a failure, print its traceback before the one-line error (anywhere on "
                             f"the command line; also: {DEBUG_ENV}=1)")
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
    p.add_argument("--resume", metavar="RUN",
                   help="continue runs/NAME (or one of its checkpoints/step_N) from its newest "
                        "complete checkpoint, with the run's config.yaml unless CONFIG is given")
    p.add_argument("--allow-config-change", metavar="KEYS",
                   help="comma-separated dotted keys a resume may change, e.g. trainer.steps")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in a run folder that already holds a run (trainer.run_name): its "
                        "logs, checkpoints and report are deleted first")
    p.set_defaults(func=_train)

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
    p.set_defaults(func=_prepare)

    p = sub.add_parser(
        "reward", help="score completions with a task's reward, to debug a reward rule",
        description="Print the score and its components as JSON: one line for the completion "
                    "given, or one line per record of --file (fields completion, ground_truth, "
                    "optional task, data_source, extra_info) and a summary line. Tasks: "
                    + "; ".join(f"{e.name}: {e.doc}" for e in VERIFIERS))
    p.add_argument("completion", nargs="?", help="the completion text to score")
    p.add_argument("--task", choices=["auto", *VERIFIERS.names()], help="the verifier (default: reward.task)")
    p.add_argument("--ground-truth", help="the ground truth (countdown/piecewise: JSON)")
    p.add_argument("--extra-info", help="extra_info JSON object passed to the verifier")
    p.add_argument("--file", help="JSONL of {completion, ground_truth, task?} records")
    p.add_argument("--fn", help="custom reward module:function (reward.fn)")
    p.add_argument("--timeout", type=float, help="seconds per sample for math / reward.fn")
    p.add_argument("--config", help="a train config whose reward section to use (weights, task)")
    p.set_defaults(func=_reward)

    from reasonrl.registry import TOOLS
    from reasonrl.tools import SANDBOX_MODES

    p = sub.add_parser(
        "tool", help="run one tool call through the training sandbox, to debug a tool",
        description="Call a tool as an environment would and print its observation as JSON: output, "
                    "error, timed_out, seconds, exit_code, truncated, and the sandbox mode (auto: "
                    "bwrap, else unshare, else it refuses; bwrap: bubblewrap's namespaces; unshare: "
                    "util-linux unshare's namespaces and a private read-only root; rlimit, only when "
                    "chosen: resource limits and an unprivileged user, the host's files visible). ARGS is "
                    "the call's text, a JSON object ({\"code\": ...}), or - to read it from stdin. "
                    "Tools: " + "; ".join(f"{e.name}: {e.doc}" for e in TOOLS)
                    + ". See docs/tools.md for what each sandbox mode blocks.")
    p.add_argument("name", choices=TOOLS.names(), help="the tool")
    p.add_argument("arguments", metavar="ARGS", help="the call's arguments (text, JSON object, or -)")
    p.add_argument("--timeout", type=float, help="wall-clock seconds (default 10)")
    p.add_argument("--memory-mb", type=int, help="address space of the code's process in MB (default 512)")
    p.add_argument("--disk-mb", type=int, help="disk its directory may take, in MB (default 64)")
    p.add_argument("--sandbox", choices=SANDBOX_MODES, help="sandbox mode (default auto)")
    p.set_defaults(func=_tool)

    p = sub.add_parser(
        "report", help="write report.html (curves, timings, samples, config) for runs",
        description="One self-contained HTML file (plots inlined, no network needed) from run "
                    "directories: training curves, seconds per stage per step, held-out results, "
                    "completions at the first, middle and last step, and the resolved config. "
                    "One run: RUN/report.html (also written at the end of training); several: "
                    "their curves overlaid, in compare-A-vs-B.html beside the first run.")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (with metrics.jsonl)")
    p.add_argument("-o", "--output", help="where to write the HTML file")
    p.set_defaults(func=_report)

    add_commands(sub)  # eval, probe
    return parser


DEBUG_ENV = "REASONRL_DEBUG"

# What a failure is, for its exit code: the input (config, data, run directory, disk, the
# machine's sandbox) is at fault -> 2; the run itself failed -> 1
USER_ERRORS = (DataError, GroundTruthError, ModelLoadError, FileExistsError, ReportError, MissingExtraError,
               PlacementError, ReasonRLError, SandboxError)


def debug_wanted(args: argparse.Namespace | None) -> bool:
    """`--debug` given, or REASONRL_DEBUG set to anything but "", 0, false or no."""
    flag = args is not None and getattr(args, "debug", False)
    return bool(flag) or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def one_line(text: str) -> str:
    """A message on one line: its lines joined by " | " (a multi-line message, e.g. a YAML
    parser's, stays readable and greppable)."""
    return " | ".join(line.strip() for line in str(text).strip().splitlines() if line.strip())


def failure_line(err: BaseException) -> tuple[str, int]:
    """(the one line a failure ends in, its exit code)."""
    if isinstance(err, ConfigError):
        return f"reasonrl: config error: {one_line(err)}", 2
    if isinstance(err, USER_ERRORS):
        return f"reasonrl: error: {one_line(err)}", 2
    if isinstance(err, TrainingAborted):
        return f"reasonrl: error: {one_line(err)}", 1
    what = one_line(err) or "(no message)"
    return (f"reasonrl: error: {type(err).__name__}: {what} (unexpected: rerun with --debug, or "
            f"{DEBUG_ENV}=1, for the traceback)"), 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    end = argv.index("--") if "--" in argv else len(argv)  # after `--`, "--debug" is an argument
    debug = "--debug" in argv[:end]
    argv = [a for i, a in enumerate(argv) if i >= end or a != "--debug"]
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    args.debug = debug
    # argparse stops filling `overrides` at the first option: `train c.yaml --flag a.b=1`
    # leaves `a.b=1` unparsed; anything else unknown is a real error.
    bad = [a for a in rest if "=" not in a or a.startswith("-")]
    if bad or (rest and args.command not in ("train", "eval", "probe")):
        parser.error(f"unrecognized arguments: {' '.join(bad or rest)}")
    if rest:
        args.overrides = [*args.overrides, *rest]
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("reasonrl: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # one line naming the fix; the traceback only when asked for
        line, code = failure_line(err)
        if debug_wanted(args):
            traceback.print_exc()
        print(line, file=sys.stderr, flush=True)
        return code


if __name__ == "__main__":
    sys.exit(main())
