"""On-policy distillation on the default task (docs/teachers.md): held-out accuracy per step for
distillation alone, distillation added to the task reward, and GRPO alone; and what the teacher
costs per step.

    python bench/distill.py --make-teacher                      # first: the teacher, `make train`'s run
    python bench/distill.py --teacher runs/distill-teacher/checkpoints/step_20      # 20 steps, seeds 0 1 2
    python bench/distill.py data.val_size=50 --teacher runs/distill-teacher/checkpoints/step_20 \\
        --steps 8 --eval-every 4 --seeds 0                          # shorter: overrides before the options

The student is configs/default.yaml's model (the embedded SmolLM2-135M-Instruct: held-out ~0.2),
the teacher a checkpoint of `reasonrl train configs/default.yaml` (20 steps: held-out ~0.8;
`--make-teacher` trains it into runs/distill-teacher). Modes, each on configs/default.yaml with the
same budget (4 prompts x 8 samples per step, optim.lr 2e-5):

- `distill`: teacher.path, teacher.task_weight=0: each token's advantage is the negative reverse KL
  to the teacher alone (Thinking Machines' on-policy distillation);
- `distill+task`: teacher.task_weight=1: added to GRPO's advantage (slime's OPD);
- `grpo`: no teacher (configs/default.yaml as it is).

Each run is a fresh `reasonrl train` process with the held-out eval (greedy, the run's own eval)
every `--eval-every` steps. The teacher's held-out accuracy is measured by `reasonrl eval` with the
same settings. Printed: the machine and its load average; per mode, the mean held-out accuracy at
each eval over the seeds (and each seed's); the first eval step at which each run reached the
teacher's accuracy, and 90 % of it; the seconds per step, of the teacher stage (the teacher's
forward and the student's forward without gradient it is compared with: `time/teacher`) and its
share of the step (medians over steps after the first, means over seeds).
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

from reasonrl.accel import calibrate

REPO = Path(__file__).resolve().parent.parent
MODES = {"distill": ["teacher.task_weight=0"], "distill+task": ["teacher.task_weight=1"], "grpo": []}
ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}


def cpu_name() -> str:
    return calibrate.cpu_model()  # lscpu's model name


def reasonrl(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "reasonrl.cli", *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"[distill] `reasonrl {' '.join(args)}` failed with status {proc.returncode}")
    return proc


def make_teacher(config: Path, extra: list[str]) -> Path:
    """`make train`'s run (configs/default.yaml) into runs/distill-teacher; its last checkpoint."""
    steps = next((int(o.split("=", 1)[1]) for o in extra if o.startswith("trainer.steps=")), 20)
    print(f"[distill] training the teacher: reasonrl train {config.name} trainer.run_name=distill-teacher "
          f"{' '.join(extra)}", flush=True)
    reasonrl("train", str(config), "trainer.run_name=distill-teacher", "trainer.progress=false",
             "tracking.report=false", *extra)
    return REPO / "runs" / "distill-teacher" / "checkpoints" / f"step_{steps}"


def teacher_accuracy(config: Path, teacher: Path, extra: list[str]) -> float:
    """The teacher's held-out accuracy, evaluated as the runs' held-out evals are (greedy)."""
    with tempfile.TemporaryDirectory(prefix="distill-") as tmp:
        report = Path(tmp) / "eval.json"
        data = [o for o in extra if o.startswith(("data.", "eval.", "rollout.max_new_tokens"))]
        reasonrl("eval", "--config", str(config), "--model", str(teacher), "--greedy", "--no-progress",
                 "--no-entropy", "--output", str(report), *data)
        return float(json.loads(report.read_text())["overall"]["accuracy"])


def run(config: Path, mode: str, teacher: Path, seed: int, steps: int, eval_every: int,
        extra: list[str]) -> dict:
    """One `reasonrl train` of `mode`; its per-step rows, its evals (step, accuracy) and the load."""
    with tempfile.TemporaryDirectory(prefix="distill-") as tmp:  # each run's checkpoints: ~1.6 GB
        out = Path(tmp)
        teach = [f"teacher.path={teacher}", *MODES[mode]] if mode != "grpo" else []
        args = ["train", str(config), *teach, f"trainer.seed={seed}", f"trainer.steps={steps}",
                f"trainer.eval_every={eval_every}", f"trainer.output_dir={out}", "trainer.run_name=run",
                "trainer.progress=false", "tracking.report=false", *extra]
        load = os.getloadavg()[0]
        start = time.perf_counter()
        reasonrl(*args)
        wall = time.perf_counter() - start
        rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    return {"mode": mode, "seed": seed, "rows": [r for r in rows if "time/step" in r], "evals": evals,
            "wall": wall, "load": load}


def median(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows[1:] if key in r]  # the first step pays the start-up
    return statistics.median(values) if values else 0.0


def first_reaching(evals: list[tuple[int, float]], target: float) -> str:
    """The first eval step whose accuracy is at least `target`, or `-` (not within the run)."""
    return next((str(step) for step, acc in evals if acc >= target - 1e-9), "-")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "default.yaml")
    ap.add_argument("--teacher", type=Path, help="the teacher: a checkpoint of configs/default.yaml's run")
    ap.add_argument("--make-teacher", action="store_true", help="train it first (runs/distill-teacher)")
    ap.add_argument("--teacher-accuracy", type=float, help="its held-out accuracy (default: measured)")
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=2)
    ap.add_argument("extra", nargs="*", help="more overrides for every run, e.g. data.arithmetic.val_size=50")
    a = ap.parse_args()
    print(f"[distill] {cpu_name()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; {a.config.name}, "
          f"{a.steps} steps, eval every {a.eval_every}, seeds {a.seeds}, modes {a.modes}", flush=True)
    teacher = make_teacher(a.config, [o for o in a.extra if o.startswith("trainer.steps=")]) \
        if a.make_teacher else a.teacher
    if teacher is None:
        raise SystemExit("[distill] give --teacher runs/<name>/checkpoints/step_N, or --make-teacher")
    target = a.teacher_accuracy
    if target is None:
        target = teacher_accuracy(a.config, teacher, a.extra)
    print(f"[distill] teacher {teacher}: held-out accuracy {target:.3f}", flush=True)
    results = []
    for seed in a.seeds:
        for mode in a.modes:
            r = run(a.config, mode, teacher, seed, a.steps, a.eval_every, a.extra)
            results.append(r)
            curve = ", ".join(f"{step}: {acc:.2f}" for step, acc in r["evals"])
            print(f"[distill] {mode} seed {seed}: {median(r['rows'], 'time/step'):.2f} s/step, teacher stage "
                  f"{median(r['rows'], 'time/teacher'):.2f} s; held-out {curve}; process {r['wall']:.0f} s, "
                  f"load {r['load']:.2f}", flush=True)
    steps = [step for step, _ in results[0]["evals"]]
    print(f"\nHeld-out accuracy (greedy), mean over seeds {a.seeds} (each seed's in brackets); the "
          f"teacher: {target:.3f}\n")
    print("| step | " + " | ".join(a.modes) + " |")
    print("|---" * (len(a.modes) + 1) + "|")
    for i, step in enumerate(steps):
        cells = []
        for mode in a.modes:
            accs = [r["evals"][i][1] for r in results if r["mode"] == mode]
            each = " / ".join(f"{x:.2f}" for x in accs)
            cells.append(f"{statistics.fmean(accs):.3f}" + (f" ({each})" if len(accs) > 1 else ""))
        print(f"| {step} | " + " | ".join(cells) + " |")
    print(f"\n| mode | first step at the teacher's {target:.3f} | at 90 % of it ({0.9 * target:.3f}) | "
          "s / step | teacher stage s | share of the step |")
    print("|---|---|---|---|---|---|")
    for mode in a.modes:
        mine = [r for r in results if r["mode"] == mode]
        step_s = statistics.fmean(median(r["rows"], "time/step") for r in mine)
        teach_s = statistics.fmean(median(r["rows"], "time/teacher") for r in mine)
        reach = " / ".join(first_reaching(r["evals"], target) for r in mine)
        near = " / ".join(first_reaching(r["evals"], 0.9 * target) for r in mine)
        print(f"| {mode} | {reach} | {near} | {step_s:.2f} | {teach_s:.2f} | "
              f"{teach_s / step_s if step_s else 0.0:.0%} |")


if __name__ == "__main__":
    main()
