"""Seconds per step before and after the log-probs stage (#42): the policy's log-probs without
gradient computed once per step (`time/logprobs`) and read by the KL in the reward, the teacher
stage and the old log-probs of a multi-update step, where each computed its own before.

    python bench/logprobs_stage.py                      # the commit before the stage vs this tree
    python bench/logprobs_stage.py --steps 6 --repeats 2 --before <commit>

Each configuration is run for `--steps` steps on the embedded tiny model (model.path=tiny, random
weights, 49k vocabulary: the LM head is most of its forward; the teacher is tiny too) with one
thread (trainer.threads=1), once with the code of `--before` (a `git worktree` of that commit,
default: the parent of the commit that added `logprobs_stage`) and once with this tree,
alternating, each in a fresh process that builds the `Trainer` and calls `Trainer.step` in a loop
(no held-out eval). Printed: the machine and its load average around each run; per configuration
and tree, the medians over the steps after the first of the step's CPU seconds (the process's:
what a shared, loaded machine changes least), its wall-clock seconds and the wall-clock seconds
of the stages that run a forward (`time/logprobs`, `time/reference`, `time/teacher`,
`time/values`, `time/update`), the least over `--repeats`; and the policy's forwards without
gradient per step each tree runs (by construction: tests/train/test_logprobs_stage.py counts them).

- `verl_countdown`: configs/recipes/verl_countdown.yaml (KL in the reward, k1; two mini-batches)
  on seeded Countdown problems (data.task=countdown: the recipe's TinyZero files are not needed),
  20 samples (4 prompts x 5) of at most 48 tokens: before, token_kl's forward and the old
  log-probs' forward; after, one.
- `distill`: configs/distill.yaml with teacher.path=tiny (one update: the student's forward moves
  from `teacher` to `logprobs`, none is saved); `distill_epochs2`: the same with
  optim.ppo_epochs=2 (before: the student's forward and the old log-probs' forward; after, one).
- `ppo`: configs/ppo.yaml with critic.warmup_steps=1 (every timed step updates the policy; one
  update: no forward without gradient to share, unchanged).
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
        "tracking.report=false", "trainer.epochs=0", "trainer.threads=1"]
CONFIGS = {
    "verl_countdown": ("configs/recipes/verl_countdown.yaml",
                       ["data.task=countdown", "data.train_path=", "data.val_path=", "trainer.batch_size=20",
                        "rollout.max_new_tokens=48"], "1 where it was 2"),
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


DRIVER = """
import json, sys, time
from reasonrl.config import load_config
from reasonrl.train.trainer import Trainer
config, overrides, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
trainer = Trainer(load_config(config, overrides))
rows = []
try:
    for _ in range(steps):
        cpu, wall = time.process_time(), time.perf_counter()
        metrics = trainer.step()[0]
        rows.append({"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall,
                     **{k: v for k, v in metrics.items() if k.startswith("time/")}})
finally:
    trainer.workers.close()
print("ROWS " + json.dumps(rows))
"""


def run(tree: Path, name: str, steps: int, out: Path) -> dict[str, float]:
    """`steps` steps of configuration `name` with `tree`'s code, in a process of their own
    (`Trainer.step` called in a loop: no held-out eval, nothing but the steps timed): the
    medians over the steps after the first of the step's CPU seconds (the process's, all its
    threads), its wall-clock seconds and each stage in STAGES it logged (wall-clock)."""
    config, overrides, _ = CONFIGS[name]
    overrides = [*TINY, *overrides, f"trainer.steps={steps}", f"trainer.output_dir={out}",
                 f"trainer.run_name={name}-{tree.name}-{time.monotonic_ns()}"]
    args = [sys.executable, "-c", DRIVER, str(tree / config), json.dumps(overrides), str(steps)]
    proc = subprocess.run(args, cwd=tree, env={**ENV, "PYTHONPATH": str(tree)}, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-3000:])
        raise SystemExit(f"[logprobs_stage] {name} with {tree} failed with status {proc.returncode}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("ROWS "))
    rows = json.loads(line.removeprefix("ROWS "))[1:]  # the first step warms up
    found = {"cpu": statistics.median(r["cpu"] for r in rows),
             "step": statistics.median(r["wall"] for r in rows)}
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
                        print(f"[logprobs_stage] {name:16s} {label:6s} {found['cpu']:.3f} CPU s/step, "
                              f"{found['step']:.3f} s/step "
                              f"(process {time.perf_counter() - t:.0f} s; load average {load()})", flush=True)
        finally:
            git("worktree", "remove", "--force", str(before))
    print()
    print("| config | policy forwards w/o grad per step | tree | CPU s/step | s/step | "
          + " | ".join(f"time/{s}" for s in STAGES) + " |")
    print("|---|---|---|---|---|" + "---|" * len(STAGES))
    for name in opts.configs:
        base: dict[str, float] = {}
        for label in ("before", "after"):
            runs = results[(name, label)]
            best = {k: min(r.get(k, 0.0) for r in runs) for k in ["cpu", "step", *STAGES]}
            shown = {k: any(k in r for r in runs) for k in STAGES}
            change = {k: "" if not base else f" ({100 * (best[k] / base[k] - 1):+.0f} %)"
                      for k in ("cpu", "step")}
            base = base or best
            cells = [f"{best[k]:.3f}" if shown[k] else "-" for k in STAGES]
            print(f"| {name} | {CONFIGS[name][2] if label == 'after' else ''} | {label} | "
                  f"{best['cpu']:.3f}{change['cpu']} | {best['step']:.3f}{change['step']} | "
                  + " | ".join(cells) + " |")
    print(f"\n[logprobs_stage] load average at the end {load()}")


if __name__ == "__main__":
    main()
