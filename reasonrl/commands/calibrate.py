"""`reasonrl calibrate [--reset | --precision]`: the measured choices cached on this machine
(`rollout.hf_decoder=auto`'s decoder, `model.precision=auto`'s precision), shown, deleted, or
the precision measured now."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    """The `calibrate` subcommand of the CLI's parser."""
    p = sub.add_parser(
        "calibrate", help="show, reset or rerun the machine's calibrations (decoder, precision)",
        description="Without an option: print the calibration cache's path and each entry on one line (what "
                    "it chose, the times, the CPU flags, the load per core when it was measured, when). An "
                    "entry is measured again by itself when the CPU flags differ or it was measured under "
                    "load and the machine is quiet now (docs/usage.md).")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--reset", action="store_true",
                      help="delete the cache file: every choice is measured again when next needed")
    what.add_argument("--precision", action="store_true",
                      help="measure model.precision=auto's choice now for the default model's shapes (hidden "
                           "576, intermediate 1536, 1024 tokens), ignoring the cache, and store it")
    p.set_defaults(func=calibrate_command)


def calibrate_command(args: argparse.Namespace) -> int:
    from reasonrl.accel import calibrate

    path = calibrate.cache_file()
    if args.reset:
        existed = path.exists()
        count = calibrate.reset()
        print(f"deleted {path} ({count} entr{'y' if count == 1 else 'ies'})" if existed
              else f"no calibration cache at {path}: nothing to delete", flush=True)
        return 0
    if args.precision:
        choice, why = calibrate.calibrate_precision(**calibrate.DEFAULT_SHAPES)
        print(f"model.precision=auto -> {choice}: {why}", flush=True)
        return 0
    found = calibrate.entries()
    print(f"{path}: {len(found)} entr{'y' if len(found) == 1 else 'ies'}" if path.exists()
          else f"{path}: none yet", flush=True)
    for key, entry in sorted(found.items()):
        print(calibrate.describe(key, entry), flush=True)
    return 0
