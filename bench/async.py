"""Asynchronous off-policy training: trainer.max_staleness K = 0 / 1 / 2, the tables of docs/async.md.

    python bench/async.py                                    # the default task, 20 steps, seeds 0 1 2
    python bench/async.py --steps 8 --seeds 0 --ks 0 1       # shorter
    python bench/async.py --config configs/tool_calculator.yaml --steps 6 --seeds 0
    python bench/async.py --ks 0 --seeds 0 placement.mode=ray trainer.threads=2      # ray mode, K = 0
    python bench/async.py --ks 1 --seeds 0 placement.mode=ray placement.num_cpus=3 \
        placement.policy.num_cpus=2                                       # ray mode, K = 1 (2 + 1 cores)

Each run is a fresh `reasonrl train` process (idle machine: run nothing beside it), with the held-out
eval every `--eval-every` steps. Printed per K (medians over steps after the first, which pays the
start of the rollout process and the decoder calibration; means over seeds):

- seconds per step, and the stages: rollout (+ reward) and update, as each side timed itself;
- the learner's idle share: time waiting for its batch (`async/wait`) over the step time;
- the generator's idle share: its wait for weights or a command (`async/producer_idle`) over its
  busy + idle time; the weight-sync pause (`async/sync_pause`, the copy into its engine);
- overlap: 1 - step / (rollout + update), the share of the serial time the two sides hid;
- held-out accuracy after the last step, and at equal wall time: the last eval each run had reached
  within the training time (steps only, evals excluded) of the quickest run;
- for K = 0, the projection for one device per side: serial step / max(rollout, update) is the most
  asynchrony can gain when the two sides do not share cores.

The machine's CPU and load average are printed with the figures.
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


def cpu_name() -> str:
    return calibrate.cpu_model()  # lscpu's model name


def run(config: Path, k: int, seed: int, steps: int, eval_every: int, extra: list[str]) -> dict:
    """One `reasonrl train`; its per-step metrics, evals with their wall time, and totals."""
    with tempfile.TemporaryDirectory(prefix="async-") as tmp:  # each run's checkpoints: ~1.6 GB
        out = Path(tmp)
        args = [sys.executable, "-m", "reasonrl.cli", "train", str(config), f"trainer.max_staleness={k}",
                f"trainer.seed={seed}", f"trainer.steps={steps}", f"trainer.eval_every={eval_every}",
                f"trainer.output_dir={out}", "trainer.run_name=run", "trainer.progress=false",
                "tracking.report=false", *extra]
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
        load = os.getloadavg()[0]
        start = time.perf_counter()
        proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-3000:])
            raise SystemExit(f"[async] K={k} seed={seed} failed with status {proc.returncode}")
        rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
        steps_rows = [r for r in rows if "time/step" in r]
        clock, evals = 0.0, []  # training wall time (steps only, evals excluded) at each eval
        for r in rows:
            clock += r.get("time/step", 0.0)
            if "eval/accuracy" in r:
                evals.append((clock, r["step"], r["eval/accuracy"]))
        return {"k": k, "seed": seed, "rows": steps_rows, "evals": evals, "wall": wall, "load": load}


def median(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows[1:] if key in r]  # the first step pays the start-up
    return statistics.median(values) if values else 0.0


def summary(result: dict) -> dict:
    rows = result["rows"]
    step, rollout = median(rows, "time/step"), median(rows, "time/rollout") + median(rows, "time/reward")
    update = median(rows, "time/update")
    wait, idle = median(rows, "async/wait"), median(rows, "async/producer_idle")
    pause = median(rows, "async/sync_pause")
    return {"step": step, "rollout": rollout, "update": update,
            "learner_idle": wait / step if step else 0.0,
            "generator_idle": idle / (idle + rollout) if idle + rollout else 0.0, "pause": pause,
            "overlap": 1 - step / (rollout + update) if result["k"] and rollout + update else 0.0,
            "final": result["evals"][-1][2] if result["evals"] else float("nan"),
            "train_s": sum(r["time/step"] for r in rows), "load": result["load"]}


def at_wall(result: dict, seconds: float) -> float:
    """The held-out accuracy of the last eval reached within `seconds` of training."""
    reached = [acc for clock, _, acc in result["evals"] if clock <= seconds + 1e-9]
    return reached[-1] if reached else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "default.yaml")
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("extra", nargs="*", help="more overrides, e.g. rollout.threads=1")
    a = ap.parse_args()
    print(f"[async] {cpu_name()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; {a.config.name}, "
          f"{a.steps} steps, eval every {a.eval_every}", flush=True)
    results = []
    for seed in a.seeds:
        for k in a.ks:
            r = run(a.config, k, seed, a.steps, a.eval_every, a.extra)
            s = summary(r)
            results.append((r, s))
            print(f"[async] K={k} seed={seed}: {s['step']:.2f} s/step (rollout {s['rollout']:.2f}, update "
                  f"{s['update']:.2f}), learner idle {s['learner_idle']:.0%}, generator idle "
                  f"{s['generator_idle']:.0%}, sync pause {s['pause']:.3f} s, overlap {s['overlap']:.0%}, "
                  f"held-out {s['final']:.3f}, process {r['wall']:.0f} s, load {s['load']:.2f}", flush=True)
    common = min(s["train_s"] for _, s in results)
    print(f"\n| K | s / step | rollout s | update s | learner idle | generator idle | sync pause s | overlap "
          f"| held-out after {a.steps} steps | held-out at {common:.0f} s of training |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k in a.ks:
        mine = [(r, s) for r, s in results if r["k"] == k]

        def mean(key: str, mine=mine) -> float:
            return statistics.fmean(s[key] for _, s in mine)

        finals = " / ".join(f"{s['final']:.3f}" for _, s in mine)
        walls = " / ".join(f"{at_wall(r, common):.3f}" for r, _ in mine)
        print(f"| {k} | {mean('step'):.2f} | {mean('rollout'):.2f} | {mean('update'):.2f} | "
              f"{mean('learner_idle'):.0%} | {mean('generator_idle'):.0%} | {mean('pause'):.3f} | "
              f"{mean('overlap'):.0%} | {finals} | {walls} |")
    base = [s for r, s in results if r["k"] == 0]
    if base:
        serial = statistics.fmean(s["rollout"] + s["update"] for s in base)
        bound = statistics.fmean(max(s["rollout"], s["update"]) for s in base)
        print(f"\nK=0 serial step {serial:.2f} s = rollout + update; with one device per side a K >= 1 step "
              f"is at best max(rollout, update) = {bound:.2f} s: up to {serial / bound:.2f}x (the stage "
              "times above were measured with every core on one side at a time)")


if __name__ == "__main__":
    main()
