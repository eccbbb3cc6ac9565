"""Seconds per step before and after the log-probs stage (#42): the policy's log-probs without
gradient computed once per step (`time/logprobs`) and read by the KL in the reward, the teacher
stage and the old log-probs of a multi-update step, where each computed its own before.

    python bench/logprobs_stage.py                      # the commit before the stage vs this tree
    python bench/logprobs_stage.py --steps 6 --repeats 2 --before <commit>

Each configuration is run for `--steps` steps on the embedded tiny model (model.path=tiny, random
weights, 49k vocabulary: the LM head is most of its forward; the teacher is tiny too), once with
the code of `--before` (a `git worktree` of that commit, default: the parent of the commit that
added `logprobs_stage`) and once with this tree, alternating, each a fresh `reasonrl train`
process on the same machine. Printed: the machine and its load average around each run; per
configuration and tree, the median over the steps after the first of `time/step` and of the
stages that run a forward (`time/logprobs`, `time/reference`, `time/teacher`, `time/values`,
`time/update`); the policy's forwards without gradient per step each tree runs.

- `verl_countdown`: configs/recipes/verl_countdown.yaml (KL in the reward, k1; two mini-batches)
  on seeded Countdown problems (data.task=countdown: the recipe's TinyZero files are not needed),
  40 samples (8 prompts x 5) of at most 64 tokens: before, token_kl's forward and the old log-probs'
  forward; after, one.
- `distill`: configs/distill.yaml with teacher.path=tiny (one update: the student's forward moves
  from `teacher` to `logprobs`, none is saved); `distill_epochs2`: the same with
  optim.ppo_epochs=2 (before: the student's forward and the old log-probs' forward; after, one).
- `ppo`: configs/ppo.yaml (critic, one update: no forward without gradient to share; unchanged).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY = ["model.path=tiny", "trainer.eval_every=0", "trainer.save_every=0", "trainer.progress=false",
        "tracking.report=false", "trainer.epochs=0"]
CONFIGS = {
    "verl_countdown": ("configs/recipes/verl_countdown.yaml",
                       ["data.task=countdown", "data.train_path=", "data.val_path=", "trainer.batch_size=40",
                        "rollout.max_new_tokens=64"], "1 where it was 2"),
    "distill": ("configs/distill.yaml", ["teacher.path=tiny"], "1 where it was 1"),
    "distill_epochs2": ("configs/distill.yaml", ["teacher.path=tiny", "optim.ppo_epochs=2"],
                        "1 where it was 2"),
    "ppo": ("configs/ppo.yaml", ["critic.warmup_steps=1"], "0 where it was 0"),
}
STAGES = ["logprobs", "reference", "teacher", "values", "update"]
ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def before_commit() -> str:
    """The parent of the commit that added `logprobs_stage` to the trainer."""
    added = git("log", "--format=%H", "-S", "def logprobs_stage", "--", "reasonrl/train/trainer.py").split()
    if not added:
        raise SystemExit("[logprobs_stage] no commit adds logprobs_stage here: pass --before <commit>")
    return git("rev-parse", f"{added[-1]}^")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run(tree: Path, name: str, steps: int, out: Path) -> dict[str, float]:
    """One `reasonrl train` of configuration `name` with `tree`'s code: the medians over the
    steps after the first of time/step and of each stage in STAGES it logged."""
    config, overrides, _ = CONFIGS[name]
    run_name = f"{name}-{tree.name}-{time.monotonic_ns()}"
    args = [sys.executable, "-m", "reasonrl.cli", "train", str(tree / config), *TINY, *overrides,
            f"trainer.steps={steps}", f"trainer.output_dir={out}", f"trainer.run_name={run_name}"]
    proc = subprocess.run(args, cwd=tree, env={**ENV, "PYTHONPATH": str(tree)}, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-3000:])
        raise SystemExit(f"[logprobs_stage] {name} with {tree} failed with status {proc.returncode}")
    rows = [json.loads(x) for x in (out / run_name / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step" in r][1:]  # the first step warms up
    found = {"step": statistics.median(r["time/step"] for r in rows)}
    for stage in STAGES:
        if any(f"time/{stage}" in r for r in rows):
            found[stage] = statistics.median(r.get(f"time/{stage}", 0.0) for r in rows)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", help="the commit before the change (default: the parent of the commit "
                                         "that added logprobs_stage)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    opts = parser.parse_args()
    from reasonrl.accel import calibrate

    commit = opts.before or before_commit()
    print(f"[logprobs_stage] {calibrate.cpu_model()}, {os.cpu_count()} cores; load average {load()}; "
          f"before = {commit[:10]}, after = {REPO} ({git('rev-parse', '--short', 'HEAD')} + working tree); "
          f"tiny model, {opts.steps} steps, medians over steps 2..{opts.steps}", flush=True)
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="logprobs_stage_") as tmp:
        before = Path(tmp) / "before"
        git("worktree", "add", "--detach", str(before), commit)
        try:
            for name in opts.configs:
                for _ in range(opts.repeats):
                    for label, tree in (("before", before), ("after", REPO)):
                        t = time.perf_counter()
                        found = run(tree, name, opts.steps, Path(tmp) / "runs")
                        results.setdefault((name, label), []).append(found)
                        print(f"[logprobs_stage] {name:16s} {label:6s} {found['step']:.3f} s/step "
                              f"(process {time.perf_counter() - t:.0f} s; load average {load()})", flush=True)
        finally:
            git("worktree", "remove", "--force", str(before))
    print()
    print("| config | forwards w/o grad per step | tree | s/step | "
          + " | ".join(f"time/{s}" for s in STAGES) + " |")
    print("|---|---|---|---|" + "---|" * len(STAGES))
    for name in opts.configs:
        base = None
        for label in ("before", "after"):
            runs = results[(name, label)]
            mean = {k: statistics.fmean(r.get(k, 0.0) for r in runs) for k in ["step", *STAGES]}
            shown = {k: any(k in r for r in runs) for k in STAGES}
            change = "" if base is None else f" ({100 * (mean['step'] / base - 1):+.1f} %)"
            base = mean["step"] if base is None else base
            cells = [f"{mean[k]:.3f}" if shown[k] else "-" for k in STAGES]
            print(f"| {name} | {CONFIGS[name][2] if label == 'after' else ''} | {label} | "
                  f"{mean['step']:.3f}{change} | " + " | ".join(cells) + " |")
    print(f"\n[logprobs_stage] load average at the end {load()}")


if __name__ == "__main__":
    main()
