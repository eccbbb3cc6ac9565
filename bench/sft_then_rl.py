"""SFT then RL against RL alone, at equal training time, on a task the default model cannot learn
by RL alone (docs/sft.md, "SFT, then RL").

The task is Countdown with three numbers (1-99, a target up to 100), for which `reasonrl probe`
says `too_hard` for SmolLM2-135M-Instruct: too few samples earn any reward for GRPO to learn from.
Its problems are written to two files once (training and held-out, no problem in both), so the
runs train without a held-out set of their own and every number of the table is measured by the
same `reasonrl eval` command (greedy, the held-out file) on the checkpoint a run ends with.

Per seed, two arms with the same training time (the sum of their steps' `time/step`: model
loading and evaluations are not counted, the machine's load moves both alike):

- `rl`: `reasonrl train` (configs/countdown.yaml on the problem files) from the default model,
  stopped by SIGINT once its steps have taken --budget seconds (it finishes the step, saves a
  checkpoint and exits, as a user's Ctrl-C does);
- `sft+rl`: `reasonrl sft` (configs/sft.yaml: the training problems with a solver's worked
  solutions) for --sft-steps steps, then `reasonrl train` from its checkpoint for the rest of the
  budget, stopped the same way.

It prints the table (held-out accuracy before, after SFT, after; steps; seconds per step; peak
RSS of each process) and writes it with every run's numbers to OUT/results.json; the probe's
verdict is measured on the base model and on the first seed's SFT checkpoint (--no-probe: not).

    python bench/sft_then_rl.py --seeds 0,1,2 --budget 300 --sft-steps 4 --sft-batch 16 --sft-lr 1e-4 \
        --out runs/bench_sft_rl
    python bench/sft_then_rl.py --seeds 2 --append ...   # one more seed into the same results.json
    python bench/sft_then_rl.py --table runs/bench_sft_rl/results.json   # an earlier run's table again

(docs/sft.md has the table this made; results.json is written after each seed.)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_problems(out: Path, train_size: int, val_size: int) -> tuple[Path, Path]:
    """Countdown problems with three numbers: training problems (generator seed 1) and held-out
    ones (seed 2, none of them among the training problems), as `data.task=file` records."""
    from reasonrl.config import CountdownConfig
    from reasonrl.data.countdown import countdown_examples
    from reasonrl.data.readers import write_records

    cfg = CountdownConfig(min_numbers=3, max_numbers=3, train_size=train_size, val_size=val_size)
    held_out = countdown_examples(cfg, seed=2)[1]
    seen = {e.ground_truth for e in held_out}
    train = [e for e in countdown_examples(cfg, seed=1)[0] if e.ground_truth not in seen]

    def records(examples):
        return [{"prompt": e.prompt, "ground_truth": e.ground_truth, "data_source": "countdown",
                 "extra_info": {k: v for k, v in e.meta.items() if k != "solution"}} for e in examples]

    paths = out / "countdown_train.jsonl", out / "countdown_held_out.jsonl"
    write_records(records(train), paths[0])
    write_records(records(held_out), paths[1])
    return paths


def steps_seconds(metrics: Path) -> list[float]:
    """Each training step's `time/step` logged so far."""
    if not metrics.is_file():
        return []
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [r["time/step"] for r in rows if r.get("step", 0) > 0 and "time/step" in r]


def run(argv: list[str], log: Path, budget: float | None = None, metrics: Path | None = None) -> dict:
    """`reasonrl ARGV` in a child process, its output to `log`; with `budget`, SIGINT once the
    steps logged in `metrics` have taken that many seconds. Its wall time, exit code and peak RSS
    (the child's own, from wait4)."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "reasonrl", *argv], stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=REPO)
        stopped = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if budget is not None and not stopped and sum(steps_seconds(metrics)) >= budget:
                proc.send_signal(signal.SIGINT)  # the step finishes, a checkpoint is saved
                stopped = True
            time.sleep(1.0)
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 130):
        raise SystemExit(f"`reasonrl {' '.join(argv)}` exited {code}; see {log}")
    return {"wall_s": time.perf_counter() - start, "exit": code, "peak_rss_gib": usage.ru_maxrss / 2 ** 20}


def last_checkpoint(run_dir: Path) -> Path:
    return max(run_dir.glob("checkpoints/step_*"), key=lambda p: int(p.name.split("_")[1]))


def evaluate(model: str, held_out: Path, out: Path, name: str, max_new_tokens: int) -> float:
    """The held-out accuracy of `model` (greedy, the same command for every number)."""
    report = out / f"eval_{name}.json"
    run(["eval", "--config", "configs/countdown.yaml", "--model", model, "--data", str(held_out), "--greedy",
         "--max-new-tokens", str(max_new_tokens), "--no-entropy", "--no-progress", "--output", str(report)],
        out / f"eval_{name}.log")
    return json.loads(report.read_text())["overall"]["accuracy"]


def probe(model: str, held_out: Path, out: Path, name: str, max_new_tokens: int) -> dict:
    report = out / f"probe_{name}.json"
    run(["probe", "--config", "configs/countdown.yaml", "--model", model, "--data", str(held_out), "--n", "4",
         "--limit", "16", "--max-new-tokens", str(max_new_tokens), "--no-entropy", "--no-progress",
         "--output", str(report)], out / f"probe_{name}.log")
    found = json.loads(report.read_text())
    return {"verdict": found["verdict"]["status"], "accuracy": found["overall"]["accuracy"],
            "reward_variance": found["overall"]["reward_variance"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--budget", type=float, default=300.0,
                        help="training seconds per arm (its steps' time/step)")
    parser.add_argument("--sft-steps", type=int, default=4)
    parser.add_argument("--sft-batch", type=int, default=16, help="records per SFT step")
    parser.add_argument("--sft-lr", type=float, default=1e-4)
    parser.add_argument("--rl-batch", type=int, default=16, help="completions per RL step (4 per prompt)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--val-size", type=int, default=30)
    parser.add_argument("--out", default="runs/bench_sft_rl")
    parser.add_argument("--no-probe", action="store_true")
    parser.add_argument("--append", action="store_true",
                        help="add these seeds' runs to OUT/results.json (same settings)")
    parser.add_argument("--model", default="",
                        help="model.path of both arms ('' = the embedded default; tiny: a smoke check)")
    args = parser.parse_args()
    out = (REPO / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    train, held_out = write_problems(out, args.train_size, args.val_size)
    tokens = str(args.max_new_tokens)
    data = [f"model.path={args.model}", f"data.train_path={train}", "data.val_path=", "data.task=file",
            f"trainer.output_dir={out / 'runs'}", "trainer.progress=false", "tracking.report=false",
            "trainer.keep_last=1"]
    rl = ["train", "configs/countdown.yaml", *data, "trainer.steps=10000", "rollout.n=4",
          f"trainer.batch_size={args.rl_batch}", f"rollout.max_new_tokens={tokens}",
          "optim.micro_batch_size=16"]
    sft = ["sft", "configs/sft.yaml", *data, f"trainer.steps={args.sft_steps}",
           f"trainer.batch_size={args.sft_batch}", f"optim.lr={args.sft_lr}", "sft.generate_eval=false",
           "trainer.eval_every=0", f"rollout.max_new_tokens={tokens}"]
    results: dict = {"settings": vars(args), "runs": []}
    if args.append and (out / "results.json").exists():
        results = json.loads((out / "results.json").read_text())
        mine = {k: v for k, v in vars(args).items() if k not in ("seeds", "append", "no_probe")}
        theirs = {k: results["settings"].get(k) for k in mine}
        if mine != theirs:
            sys.exit(f"--append: {out / 'results.json'} was made with other settings: {theirs}")
        done = {r["seed"] for r in results["runs"]}
        if done & {int(s) for s in args.seeds.split(",")}:
            sys.exit(f"--append: {out / 'results.json'} has seeds {sorted(done)} already")
        args.no_probe = True  # the probes are the first run's
    else:
        print(f"[bench] problems: {train}, {held_out}; base model's held-out accuracy ...", flush=True)
        results["base_accuracy"] = evaluate(args.model, held_out, out, "base", args.max_new_tokens)
    if not args.no_probe:
        results["probe_base"] = probe(args.model, held_out, out, "base", args.max_new_tokens)
        print(f"[bench] probe of the base model: {results['probe_base']}", flush=True)
    for seed in [int(s) for s in args.seeds.split(",")]:
        name = f"rl_s{seed}"
        print(f"[bench] seed {seed}: RL alone, {args.budget:g} s of training ...", flush=True)
        proc = run([*rl, f"trainer.seed={seed}", f"trainer.run_name={name}"], out / f"{name}.log",
                   args.budget, out / "runs" / name / "metrics.jsonl")
        steps = steps_seconds(out / "runs" / name / "metrics.jsonl")
        ckpt = last_checkpoint(out / "runs" / name)
        results["runs"].append({"seed": seed, "arm": "rl", "sft_steps": 0, "sft_s": 0.0,
                                "rl_steps": len(steps), "rl_s": sum(steps),
                                "rl_s_per_step": statistics.median(steps),
                                "peak_rss_gib": proc["peak_rss_gib"], "after_sft": None,
                                "after": evaluate(str(ckpt), held_out, out, name, args.max_new_tokens)})
        print(f"[bench] {results['runs'][-1]}", flush=True)

        name = f"sft_s{seed}"
        print(f"[bench] seed {seed}: SFT ({args.sft_steps} steps), then RL for the rest ...", flush=True)
        sft_proc = run([*sft, f"trainer.seed={seed}", f"trainer.run_name={name}"], out / f"{name}.log")
        sft_steps = steps_seconds(out / "runs" / name / "metrics.jsonl")
        sft_ckpt = last_checkpoint(out / "runs" / name)
        after_sft = evaluate(str(sft_ckpt), held_out, out, name, args.max_new_tokens)
        if seed == int(args.seeds.split(",")[0]) and not args.no_probe:
            results["probe_after_sft"] = probe(str(sft_ckpt), held_out, out, name, args.max_new_tokens)
            print(f"[bench] probe after SFT: {results['probe_after_sft']}", flush=True)
        rl_name = f"sft_rl_s{seed}"
        left = max(args.budget - sum(sft_steps), 1.0)
        proc = run([*rl, f"model.path={sft_ckpt}", f"trainer.seed={seed}", f"trainer.run_name={rl_name}"],
                   out / f"{rl_name}.log", left, out / "runs" / rl_name / "metrics.jsonl")
        steps = steps_seconds(out / "runs" / rl_name / "metrics.jsonl")
        ckpt = last_checkpoint(out / "runs" / rl_name)
        results["runs"].append({"seed": seed, "arm": "sft+rl", "sft_steps": len(sft_steps),
                                "sft_s": sum(sft_steps), "sft_s_per_step": statistics.median(sft_steps),
                                "rl_steps": len(steps),
                                "rl_s": sum(steps), "rl_s_per_step": statistics.median(steps),
                                "peak_rss_gib": max(sft_proc["peak_rss_gib"], proc["peak_rss_gib"]),
                                "after_sft": after_sft,
                                "after": evaluate(str(ckpt), held_out, out, rl_name, args.max_new_tokens)})
        print(f"[bench] {results['runs'][-1]}", flush=True)
        (out / "results.json").write_text(json.dumps(results, indent=1))
    print_table(results)


def print_table(results: dict) -> None:
    base = results["base_accuracy"]
    print("\n| seed | arm | SFT steps (s/step) | RL steps (s/step) | training s | held-out before | "
          "after SFT | after | peak RSS GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results["runs"]:
        sft = f"{r['sft_steps']} ({r['sft_s_per_step']:.0f})" if r["sft_steps"] else "-"
        after_sft = "-" if r["after_sft"] is None else f"{r['after_sft']:.3f}"
        print(f"| {r['seed']} | {r['arm']} | {sft} | {r['rl_steps']} ({r['rl_s_per_step']:.0f}) | "
              f"{r['sft_s'] + r['rl_s']:.0f} | {base:.3f} | {after_sft} | {r['after']:.3f} | "
              f"{r['peak_rss_gib']:.1f} |")
    for arm in ("rl", "sft+rl"):
        after = [r["after"] for r in results["runs"] if r["arm"] == arm]
        if after:
            print(f"{arm}: held-out after, mean over {len(after)} seeds: {statistics.mean(after):.3f}")
    for key in ("probe_base", "probe_after_sft"):
        if key in results:
            print(f"{key}: {results[key]}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--table":  # the table of an earlier run's results.json
        print_table(json.loads(Path(sys.argv[2]).read_text()))
    else:
        main()
