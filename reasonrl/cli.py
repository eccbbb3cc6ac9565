"""Command line: the parser built from the commands' own modules (`reasonrl.commands`, one
module per command, each declaring its options), the dispatch, and the one line a failure ends in.

    reasonrl train [CONFIG.yaml] [dotted.key=value ...]
    reasonrl sft [CONFIG.yaml] [dotted.key=value ...]
    reasonrl data prepare gsm8k|math|countdown|piecewise [--input PATH] --output FILE
    reasonrl data traces RUN|EVAL.json [...] [--min-reward R] [--dedupe] [--out FILE]
    reasonrl reward --task T --ground-truth GT "completion"   |   reasonrl reward --file F.jsonl
    reasonrl tool calculator|python 'ARGS' [--timeout S] [--memory-mb N] [--disk-mb N] [--sandbox MODE]
    reasonrl report RUN [RUN ...] [-o report.html]
    reasonrl eval  [--config C] [--model M] [--data FILE|TASK] [--n 16 --k 1,4,16] [--output F.json]
    reasonrl probe [--config C] [--model M] [--data FILE|TASK]
    reasonrl calibrate [--reset | --precision]
    reasonrl serve [CHECKPOINT] [--host H] [--port P] [--config C] [dotted.key=value ...]

Every failure ends in one line on stderr, `reasonrl: error: ...` (`reasonrl: config error: ...`
for a configuration key) naming what happened and what to do, with exit code 2 when the input
is at fault (config, data, run directory, disk, the machine's sandbox) and 1 when the run
itself failed (training aborted, or an error reasonrl did not expect). No traceback, unless
`--debug` (before or after the command) or the environment variable REASONRL_DEBUG=1 asks for
one: then the traceback comes first and the same line last, with the same exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

import reasonrl  # noqa: F401  (sets OMP_WAIT_POLICY before torch is imported)
from reasonrl.commands import calibrate, data, eval, probe, report, reward, serve, sft, tool, train
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

# The commands, in --help's order: each module declares its own subcommand (`add_parser`)
COMMANDS = (train, sft, data, reward, tool, report, eval, probe, calibrate, serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reasonrl",
        description="GRPO-family reinforcement learning for language models on checkable tasks.")
    # main() takes --debug out of the arguments wherever it stands; declared here for --help
    parser.add_argument("--debug", action="store_true",
                        help=f"on a failure, print its traceback before the one-line error (anywhere on "
                             f"the command line; also: {DEBUG_ENV}=1)")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
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
    if bad or (rest and args.command not in ("train", "sft", "eval", "probe", "serve")):
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
