"""model.precision fp32 / bf16-mixed / bf16 on the default task: speed, memory and what training reaches.

    python bench/precision.py                                  # 20 steps x seeds 0 1 2 x 3 precisions
    python bench/precision.py --steps 2 --seeds 1 --precisions fp32 --eval-size 8     # a smoke
    python bench/precision.py --out precision.json trainer.threads=2                  # more overrides

Each run is a fresh `reasonrl train configs/default.yaml model.precision=P trainer.seed=S
trainer.steps=N` process (the embedded SmolLM2-135M-Instruct; `model.path` left as the config has
it) in a temporary folder, removed after the run. The runs alternate: seed 0 with every precision,
then seed 1, ..., so that a change in the machine's load reaches every precision alike; compare the
precisions by the ratios of one invocation, not with figures of another day. Run nothing beside it.

Printed per run and per precision (mean over seeds, and each seed's figure):

- seconds per step: the median of `time/step` over the steps after the first (the first pays the
  decoder calibration and the allocator's first growth);
- rollout tokens/s: the median of `rollout/tokens_per_s` (generated tokens over `time/rollout`);
- update ms per token: the median of `time/update` / `train/tokens` (the completion tokens trained on);
- peak RSS: the process's VmHWM (/proc/<pid>/status) when `reasonrl train` returns, read by the
  process itself (a wrapper that runs the command in-process): getrusage's ru_maxrss would carry
  the parent's high-water mark across the fork;
- `auto`'s resolved precision (the run's config.yaml), beside its name;
- held-out accuracy before and after training (summary.json's eval_before / eval_after, greedy,
  `--eval-size` problems);
- against fp32: the ratios of the speed and memory figures, and the change of held-out accuracy
  after training, paired by seed, with twice its standard error (sqrt(var_fp32/n + var_P/n) over
  the n seeds): "within seed noise" when the change is smaller than that.

The CPU model, the flags that decide bf16's speed (amx_bf16, avx512_bf16, ...) and the load
average before and after each run are printed with the figures; `--out FILE` writes all of them
(and every step's times) as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "default.yaml"
PRECISIONS = ("fp32", "bf16-mixed", "bf16", "auto")
# `reasonrl train ...` in this process, then the process's own peak RSS (kB) into the file argv[1]
WRAPPER = """
import re, sys
from reasonrl.cli import main
try:
    code = main(sys.argv[2:])
finally:
    status = open('/proc/self/status').read()
    open(sys.argv[1], 'w').write(re.search(r'VmHWM:\\s+(\\d+)', status).group(1))
sys.exit(code)
"""


def run(precision: str, seed: int, steps: int, eval_size: int | None, extra: list[str]) -> dict:
    """One `reasonrl train` run: its per-step figures, held-out accuracy, peak RSS and load."""
    with tempfile.TemporaryDirectory(prefix="precision-") as tmp:  # the final checkpoint: 0.3-0.6 GB
        out = Path(tmp)
        overrides = [f"model.precision={precision}", f"trainer.seed={seed}", f"trainer.steps={steps}",
                     f"trainer.output_dir={out}", "trainer.run_name=run", "trainer.progress=false",
                     "tracking.report=false"]
        if eval_size is not None:
            overrides.append(f"data.arithmetic.val_size={eval_size}")
        args = [sys.executable, "-c", WRAPPER, str(out / "hwm"), "train", str(CONFIG), *overrides, *extra]
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-3000:])
            raise SystemExit(f"[precision] {precision} seed {seed} failed with exit code {proc.returncode}")
        rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
        summary = json.loads((out / "run" / "summary.json").read_text())
        resolved = yaml.safe_load((out / "run" / "config.yaml").read_text())["model"]["precision"]
        peak_kib = int((out / "hwm").read_text())
    steps_rows = [r for r in rows if "time/step" in r]
    return {
        "precision": precision, "resolved": resolved, "seed": seed,
        "step_s": after_first(steps_rows, lambda r: r["time/step"]),
        "rollout_tokens_per_s": after_first(steps_rows, lambda r: r["rollout/tokens_per_s"]),
        "update_ms_per_token": after_first(steps_rows, lambda r: 1e3 * r["time/update"] / r["train/tokens"]),
        "peak_rss_gib": peak_kib / 2**20,
        "before": (summary.get("eval_before") or {}).get("eval/accuracy", math.nan),
        "after": (summary.get("eval_after") or {}).get("eval/accuracy", math.nan),
        "wall_s": wall, "load_before": load_before, "load_after": os.getloadavg()[0],
        "steps": [{k: r.get(k) for k in ("time/step", "time/rollout", "time/update", "rollout/tokens_per_s",
                                         "train/tokens", "reward/mean")} for r in steps_rows],
    }


def after_first(rows: list[dict], value) -> float:
    """The median of `value(row)` over the steps after the first (a single step: that step)."""
    return statistics.median(value(r) for r in (rows[1:] or rows))


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def noise_check(base: list[dict], other: list[dict]) -> dict:
    """Held-out accuracy after training, `other` against fp32 paired by seed: the mean change and
    twice its standard error, sqrt(var_fp32 / n + var_other / n) (sample variances over the n seeds:
    the seed-to-seed spread of each side); None for the error with fewer than 2 seeds."""
    by_seed = {r["seed"]: r["after"] for r in base}
    pairs = [(by_seed[r["seed"]], r["after"]) for r in other if r["seed"] in by_seed]
    n = len(pairs)
    delta = mean([b - a for a, b in pairs])
    if n < 2:
        return {"delta": delta, "two_se": None, "within": None, "n": n}
    two_se = 2 * math.sqrt(statistics.variance([a for a, _ in pairs]) / n
                           + statistics.variance([b for _, b in pairs]) / n)
    return {"delta": delta, "two_se": two_se, "within": abs(delta) <= two_se, "n": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="training steps per run")
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1 per precision")
    ap.add_argument("--precisions", default="fp32,bf16-mixed,bf16",
                    help=f"comma-separated, in the order each seed runs them; of {', '.join(PRECISIONS)}")
    ap.add_argument("--eval-size", type=int, default=None,
                    help="held-out problems (data.arithmetic.val_size; default: the config's 100)")
    ap.add_argument("--out", type=Path, help="write every figure as JSON to this file")
    ap.add_argument("extra", nargs="*", help="more overrides for every run, e.g. trainer.threads=2")
    a = ap.parse_args()
    precisions = [p.strip() for p in a.precisions.split(",") if p.strip()]
    if bad := [p for p in precisions if p not in PRECISIONS]:
        ap.error(f"--precisions: {', '.join(bad)} not one of {', '.join(PRECISIONS)}")
    if a.steps < 1 or a.seeds < 1:
        ap.error("--steps and --seeds must be at least 1")

    from reasonrl.accel.calibrate import cpu_flags, cpu_model

    cpu, flags = cpu_model(), cpu_flags()
    load_start = os.getloadavg()
    print(f"[precision] {cpu}, {os.cpu_count()} cores, flags {' '.join(flags) or 'none'}; load average "
          f"{load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}", flush=True)
    print(f"[precision] {CONFIG.name}, {a.steps} steps x {a.seeds} seeds x {', '.join(precisions)}; "
          f"eval size {a.eval_size if a.eval_size is not None else 'as configured'}", flush=True)
    results = []
    for seed in range(a.seeds):
        for precision in precisions:
            r = run(precision, seed, a.steps, a.eval_size, a.extra)
            results.append(r)
            name = precision if r["resolved"] == precision else f"{precision} ({r['resolved']})"
            print(f"[precision] {name:10s} seed {seed}: {r['step_s']:.2f} s/step, rollout "
                  f"{r['rollout_tokens_per_s']:.0f} tokens/s, update {r['update_ms_per_token']:.2f} "
                  "ms/token, "
                  f"peak RSS {r['peak_rss_gib']:.2f} GiB, held-out {r['before']:.3f} -> {r['after']:.3f}; "
                  f"process {r['wall_s']:.0f} s, load {r['load_before']:.2f} -> {r['load_after']:.2f}",
                  flush=True)
    load_end = os.getloadavg()

    figures = ("step_s", "rollout_tokens_per_s", "update_ms_per_token", "peak_rss_gib", "before", "after")
    table = {}
    print(f"\n| precision | s / step | rollout tokens/s | update ms / token | peak RSS GiB | held-out before "
          f"| held-out after {a.steps} steps | per seed (after) |")
    print("|---|---|---|---|---|---|---|---|")
    for p in precisions:
        mine = [r for r in results if r["precision"] == p]
        table[p] = {f: mean([r[f] for r in mine]) for f in figures}
        t = table[p]
        seeds = " / ".join(f"{r['after']:.3f}" for r in mine)
        print(f"| {p} | {t['step_s']:.2f} | {t['rollout_tokens_per_s']:.0f} | "
              f"{t['update_ms_per_token']:.2f} | {t['peak_rss_gib']:.2f} | {t['before']:.3f} | "
              f"{t['after']:.3f} | {seeds} |")
    checks = {}
    if "fp32" in table:
        base = [r for r in results if r["precision"] == "fp32"]
        for p in precisions:
            if p == "fp32":
                continue
            t, f = table[p], table["fp32"]
            c = checks[p] = noise_check(base, [r for r in results if r["precision"] == p])
            noise = ("one seed: no noise estimate" if c["two_se"] is None else
                     f"2 x SE {c['two_se']:.3f} over {c['n']} seeds: "
                     f"{'within' if c['within'] else 'NOT within'} seed noise")
            print(f"{p} / fp32: step time {t['step_s'] / f['step_s']:.2f}x, rollout tokens/s "
                  f"{t['rollout_tokens_per_s'] / f['rollout_tokens_per_s']:.2f}x, update ms/token "
                  f"{t['update_ms_per_token'] / f['update_ms_per_token']:.2f}x, peak RSS "
                  f"{t['peak_rss_gib'] / f['peak_rss_gib']:.2f}x; held-out after {c['delta']:+.3f} ({noise})")
    print(f"load average at the start {load_start[0]:.2f}, at the end {load_end[0]:.2f} (1 min); "
          f"{load_end[1]:.2f} (5 min), {load_end[2]:.2f} (15 min)")
    if a.out:
        a.out.write_text(json.dumps({
            "cpu": cpu, "cores": os.cpu_count(), "flags": flags,
            "load_start": load_start, "load_end": load_end, "steps": a.steps, "seeds": a.seeds,
            "eval_size": a.eval_size, "extra": a.extra, "runs": results, "means": table,
            "against_fp32": checks}, indent=1) + "\n")
        print(f"[precision] wrote {a.out}")


if __name__ == "__main__":
    main()
