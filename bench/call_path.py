"""The call path a newcomer reads from `build_workers(cfg)`, measured: the reasonrl functions that
are handed the run's config or one of its sections (a `reasonrl.config` dataclass), in the order
they run, as the sequence of modules they live in. A *visit* is each change of module (a call
into one, or a return back to one); a visit goes *up a layer* when the module entered sits in a
higher layer of pyproject.toml's `layers` contract than the one left (a return from a worker's
module back into placement, say). It builds the tiny model's workers for configs/default.yaml in
local placement, so it takes seconds. `--entry trainer` starts at `Trainer(cfg)` instead (the
preflight, the data, the automatic choices, the workers, the batch source: what the issue that
asked for the role table measured, 61 visits and 16 up a layer then), in a temporary run folder.

    python bench/call_path.py                         # this tree
    python bench/call_path.py --before 18de2bd        # and a worktree of another commit, first
    python bench/call_path.py --entry trainer --before 18de2bd

It prints, per tree, the visits, those up a layer, the distinct modules, the first 30 visits and
the modules entered most. (docs/architecture.md, "Workers and roles", quotes the figures.)
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FULL = os.environ.get("CALL_PATH_FULL") == "1"  # print every visit, not the first 30


def measure(tree: Path, entry: str) -> None:
    """Run in a fresh interpreter whose `reasonrl` is `tree`'s (its `sys.path` first)."""
    subprocess.run([sys.executable, __file__, "--inside", str(tree), "--entry", entry], check=True,
                   env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})


def inside(tree: Path, entry: str) -> None:
    sys.path.insert(0, str(tree))
    from reasonrl.config import load_config
    from reasonrl.placement import build_workers

    text = (tree / "pyproject.toml").read_text()
    (block,) = re.findall(r'type = "layers"\s*\nlayers = \[(.*?)\]', text, re.S)
    layers = [[m.strip().removeprefix("reasonrl.") for m in line.split("|")]
              for line in re.findall(r'"([^"]+)"', block)]

    def layer(mod: str) -> int:
        for depth, names in enumerate(layers):
            if any(mod == n or mod.startswith(n + ".") for n in names):
                return len(layers) - depth
        return 0

    root = str(tree / "reasonrl") + os.sep

    def module(frame) -> str | None:
        name = frame.f_code.co_filename
        if not name.startswith(root):
            return None
        return name[len(root):].removesuffix(".py").replace(os.sep, ".").removesuffix(".__init__")

    def handed_config(frame) -> bool:
        return any(type(v).__module__.startswith("reasonrl.config") for v in frame.f_locals.values())

    seq: list[str] = []
    stack: list[tuple[str | None, bool]] = []

    def tracer(frame, event, arg):
        if event == "call":
            mod = module(frame)
            followed = mod is not None and handed_config(frame)
            stack.append((mod, followed))
            if followed and (not seq or seq[-1] != mod):
                seq.append(mod)
        elif event == "return" and stack:
            stack.pop()
            back = next((m for m, followed in reversed(stack) if followed), None)
            if back and seq and seq[-1] != back:
                seq.append(back)
        return tracer

    run = tempfile.mkdtemp(prefix="call_path_")
    cfg = load_config(tree / "configs" / "default.yaml",
                      ["model.path=tiny", "trainer.threads=1", f"trainer.output_dir={run}"])
    if entry == "trainer":
        from reasonrl.train.trainer import Trainer

        sys.settrace(tracer)
        try:
            trainer = Trainer(cfg, overwrite=True)
        finally:
            sys.settrace(None)
        workers = trainer.workers
        if trainer.source is not None:
            trainer.source.close()
        trainer.run.release()
    else:
        sys.settrace(tracer)
        try:
            workers = build_workers(cfg)
        finally:
            sys.settrace(None)
    workers.close()
    ups = sum(1 for a, b in zip(seq, seq[1:], strict=False) if layer(b) > layer(a))
    print(f"\n{tree}: {len(seq)} module visits, {ups} up a layer, {len(set(seq))} distinct modules")
    print("first 30:" if not FULL else "all:", " -> ".join(seq if FULL else seq[:30]))
    most = collections.Counter(seq).most_common(6)
    print("entered most:", ", ".join(f"{m} {n}" for m, n in most), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="a commit to measure first (in a temporary worktree)")
    parser.add_argument("--entry", choices=("workers", "trainer"), default="workers",
                        help="start at build_workers(cfg) (default) or at Trainer(cfg)")
    parser.add_argument("--inside", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(Path(args.inside), args.entry)
        return
    if args.before:
        with tempfile.TemporaryDirectory() as tmp:
            wt = Path(tmp) / "before"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(wt),
                            args.before], check=True)
            try:
                measure(wt, args.entry)
            finally:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(wt)], check=True)
    measure(REPO, args.entry)


if __name__ == "__main__":
    main()
