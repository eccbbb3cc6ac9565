"""reasonrl vs TRL's GRPOTrainer, the same work, measured in one invocation.

    python bench/vs_trl.py --setup          # once: bench/.venv-trl with torch 2.13.0 + TRL 1.16.0
    python bench/vs_trl.py                  # alternate reasonrl / TRL (matched) / TRL (defaults)
    python bench/vs_trl.py --precision bf16-mixed   # both sides in bf16 mixed precision, + TRL fp32
    make bench                              # the same two steps

The work (identical on both sides): SmolLM2-135M-Instruct (reasonrl's converted copy of the
embedded model) in the precision `--precision` names (below), 8 GSM8K questions
(tests/fixtures/gsm8k/train.jsonl, chat template, one system prompt) x 4 samples = 32
completions per step, at most 128 new tokens (`--max-new-tokens`), temperature 1, top-p 1,
no top-k, beta 0 (no reference model), lr 1e-6 constant, AdamW, grad-norm clip 1.0,
token-mean loss (TRL's `dapo`, reasonrl's `token`), one optimizer step per generation batch
in micro-batches of 8, seed 0, and the same reward function (this file's `score`: 1 when the
last number of the completion equals the answer).

Each side runs as its own process (TRL in its own virtual environment: it needs a newer
transformers than reasonrl pins) for `--steps` steps; the three setups alternate for
`--rounds` rounds so that a change in machine load hits all of them. Printed: per-step wall
time (median, min, max), seconds per stage, generated tokens per step, each process's peak
RSS, the load average during each run, and the ratios reasonrl / TRL.

- `TRL defaults`: GRPOConfig's defaults for everything not listed above; notably
  gradient checkpointing on (TRL's GRPO default).
- `TRL matched`: as above with gradient checkpointing off, which is what reasonrl does.
- reasonrl: `configs/default.yaml`'s settings with the work above and its default (HF)
  rollout engine; `--engine vllm` makes that setup use vLLM instead.
- reasonrl-vllm: the same with `rollout.engine=vllm`; run by default when vLLM is installed
  (`make vllm`), its start-up counted in the process time, not in the step times.

`--precision` (both sides alike): `fp32` (the default) runs everything in fp32, TRL with
`bf16=False`. `bf16-mixed` runs reasonrl with `model.precision=bf16-mixed` (fp32 master weights
and optimizer, bf16 compute) and TRL with `bf16=True`, its own mixed precision: the model stays
fp32 and accelerate's `prepare_model` wraps its forward in `torch.autocast(dtype=bfloat16)`, on
the CPU too (accelerate/accelerator.py, `native_amp`), so TRL's generation and its training
forward both compute in bf16. It then adds the setup `trl-fp32`: TRL matched in fp32, the same
work, so that one run holds both comparisons. The CPU's bf16 flags are printed with the figures.

This module imports only the standard library at top level: the TRL side runs it with
TRL's interpreter, the reasonrl side with ours, and reasonrl imports `score` from it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TRL_VENV = HERE / ".venv-trl"
TRL_PACKAGES = ["torch==2.13.0", "trl==1.16.0"]
QUESTIONS = REPO / "tests" / "fixtures" / "gsm8k" / "train.jsonl"
SYSTEM = "Solve the problem. Finish with: The answer is <number>."
WORK = dict(prompts=8, n=4, max_new_tokens=128, lr=1e-6, micro_batch=8, seed=0)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


# ---- the shared work ---------------------------------------------------------------------


def problems() -> list[dict]:
    """The 8 prompts (chat messages) and their answers, read from the repo's GSM8K fixture."""
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    out = []
    for row in rows[: WORK["prompts"]]:
        answer = row["answer"].split("####")[-1].strip().replace(",", "")
        out.append({"prompt": [{"role": "system", "content": SYSTEM},
                               {"role": "user", "content": row["question"]}],
                    "answer": answer})
    return out


def score(completion: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 when the completion's last number equals the ground truth (both sides use this)."""
    found = NUMBER.findall(completion)
    if not found:
        return 0.0
    try:
        return float(float(found[-1].replace(",", "")) == float(ground_truth))
    except ValueError:
        return 0.0


def peak_rss_gib() -> float:
    """The process's peak RSS: /proc's VmHWM, which starts anew at exec (getrusage's ru_maxrss
    would carry the parent's high-water mark across the fork)."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 2**20  # kB


# ---- the TRL side (runs in bench/.venv-trl) ------------------------------------------------


def run_trl(model_dir: str, steps: int, matched: bool, precision: str) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(os.cpu_count() or 1)
    rows = problems()
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])

    def reward(completions, answer, **_) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [score(t, a) for t, a in zip(texts, answer, strict=True)]

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"), max_steps=steps, seed=WORK["seed"],
        per_device_train_batch_size=WORK["micro_batch"],
        gradient_accumulation_steps=WORK["prompts"] * WORK["n"] // WORK["micro_batch"],
        num_generations=WORK["n"], max_completion_length=WORK["max_new_tokens"],
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, learning_rate=WORK["lr"],
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, use_cpu=True,
        bf16=precision == "bf16-mixed", fp16=False, report_to=[], logging_steps=1, save_strategy="no",
        disable_tqdm=True,
        **({"gradient_checkpointing": False} if matched else {}))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer)
    stages = {"rollout": 0.0, "reward": 0.0}
    tokens = [0]

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            stages[name] += time.perf_counter() - t
            if name == "rollout":
                tokens[0] += sum(len(c) for c in out[0])
            return out
        return wrapper

    trainer._generate_single_turn = timed("rollout", trainer._generate_single_turn)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    records: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.t = time.perf_counter()
            stages.update(rollout=0.0, reward=0.0)
            tokens[0] = 0

        def on_step_end(self, *_, **__):
            step = time.perf_counter() - self.t
            records.append({"step": step, "rollout": stages["rollout"], "reward": stages["reward"],
                            "update": step - stages["rollout"] - stages["reward"],
                            "tokens": tokens[0], "load": os.getloadavg()[0]})

    trainer.add_callback(StepTimer())
    try:
        trainer.train()
    finally:
        shutil.rmtree(config.output_dir, ignore_errors=True)
    return {"steps": records, "peak_rss_gib": peak_rss_gib(),
            "settings": {"gradient_checkpointing": config.gradient_checkpointing,
                         "loss_type": config.loss_type, "bf16": config.bf16,
                         "weights": str(next(model.parameters()).dtype)}}


# ---- the reasonrl side ------------------------------------------------------------------


def run_reasonrl(model_dir: str, steps: int, engine: str, precision: str) -> dict:
    from reasonrl.config import load_config
    from reasonrl.train.trainer import Trainer

    out = Path(tempfile.mkdtemp(prefix="reasonrl-bench-"))
    data = out / "train.jsonl"
    data.write_text("".join(json.dumps({"messages": r["prompt"], "ground_truth": r["answer"],
                                        "data_source": "bench"}) + "\n" for r in problems()))
    cfg = load_config(REPO / "configs" / "default.yaml", [
        f"model.path={model_dir}", "data.task=file", f"data.train_path={data}", "data.val_path=",
        f"rollout.engine={engine}", f"rollout.n={WORK['n']}",
        f"rollout.max_new_tokens={WORK['max_new_tokens']}",
        "rollout.temperature=1.0", f"reward.fn={Path(__file__).resolve()}:score", "reward.isolate_fn=false",
        f"optim.lr={WORK['lr']}", f"optim.micro_batch_size={WORK['micro_batch']}", "optim.max_grad_norm=1.0",
        "algo.beta=0.0", "algo.loss_agg=token", f"trainer.steps={steps}",
        f"trainer.batch_size={WORK['prompts'] * WORK['n']}", f"trainer.seed={WORK['seed']}",
        f"trainer.output_dir={out}", "trainer.run_name=run", "trainer.progress=false",
        "tracking.report=false",
        # fp32 is the default: no key, so that --base can name a checkout from before model.precision
        *([f"model.precision={precision}"] if precision != "fp32" else [])])
    trainer = Trainer(cfg)
    records: list[dict] = []
    step = trainer.step

    def timed_step():
        result = step()
        m = result[0]
        records.append({"step": m["time/step"], "rollout": m["time/rollout"], "reward": m["time/reward"],
                        "update": m["time/update"], "sync": m["time/sync"],
                        "tokens": round(m["rollout/tokens_per_s"] * m["time/rollout"]),
                        "load": os.getloadavg()[0]})
        return result

    trainer.step = timed_step
    try:
        trainer.fit()
    finally:  # the run's checkpoints: ~1.6 GB each time
        shutil.rmtree(out, ignore_errors=True)
    import reasonrl

    return {"steps": records, "peak_rss_gib": peak_rss_gib(),
            "settings": {"engine": engine, "gradient_checkpointing": False, "loss_agg": "token",
                         "precision": precision, "code": str(Path(reasonrl.__file__).parent.parent)}}


# ---- the orchestrator -------------------------------------------------------------------


def setup() -> None:
    if not (TRL_VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
    pip = [str(TRL_VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run(pip + ["--upgrade", "pip"], check=True)
    subprocess.run(pip + TRL_PACKAGES, check=True)
    print(f"[bench] TRL environment ready: {TRL_VENV}", flush=True)


def side(python: str, args: list[str], code: Path = REPO) -> dict:
    """Run one side in a fresh process (reasonrl imported from `code`); its last stdout line is
    the JSON result."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(code), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([python, str(Path(__file__).resolve()), *args], env=env, text=True,
                          capture_output=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"[bench] {' '.join(args)} failed with exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarise(name: str, runs: list[dict], skip_first: bool) -> dict:
    steps = [s for r in runs for s in (r["steps"][1:] if skip_first and len(r["steps"]) > 1 else r["steps"])]
    times = [s["step"] for s in steps]
    return {"name": name, "median": statistics.median(times), "min": min(times), "max": max(times),
            "n": len(times), "rollout": statistics.median(s["rollout"] for s in steps),
            "reward": statistics.median(s["reward"] for s in steps),
            "update": statistics.median(s["update"] for s in steps),
            "tokens": statistics.median(s["tokens"] for s in steps),
            "load": statistics.mean(s["load"] for s in steps),
            "rss": max(r["peak_rss_gib"] for r in runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description="reasonrl vs TRL GRPOTrainer on the same work")
    parser.add_argument("--setup", action="store_true", help=f"create {TRL_VENV.name} with {TRL_PACKAGES}")
    parser.add_argument("--steps", type=int, default=3, help="training steps per run")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the three setups")
    parser.add_argument("--engine", default="hf", help="reasonrl's rollout engine (hf or vllm)")
    parser.add_argument("--precision", choices=["fp32", "bf16-mixed"], default="fp32",
                        help="both sides' precision: fp32, or bf16-mixed (reasonrl "
                             "model.precision=bf16-mixed, TRL bf16=True; adds trl-fp32: TRL matched in fp32)")
    parser.add_argument("--only", choices=["reasonrl", "reasonrl-vllm", "reasonrl-base", "trl-matched",
                                           "trl-defaults", "trl-fp32"],
                        action="append", help="run only these setups (repeatable)")
    parser.add_argument("--base", metavar="FOLDER",
                        help="another checkout of reasonrl (e.g. `git worktree add /tmp/base <commit>`): "
                             "adds the setup reasonrl-base, the same work with that code, to compare "
                             "two versions in one run")
    parser.add_argument("--max-new-tokens", type=int, default=WORK["max_new_tokens"],
                        help="the longest completion, on both sides (docs/performance.md: 128 and 512)")
    parser.add_argument("--keep-first", action="store_true",
                        help="count each run's first step (warm-up) in the statistics")
    parser.add_argument("--side", choices=["trl", "trl-matched", "reasonrl"], help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    WORK["max_new_tokens"] = args.max_new_tokens

    if args.side == "reasonrl":
        print(json.dumps(run_reasonrl(args.model_dir, args.steps, args.engine, args.precision)), flush=True)
        return
    if args.side in ("trl", "trl-matched"):
        print(json.dumps(run_trl(args.model_dir, args.steps, args.side == "trl-matched", args.precision)),
              flush=True)
        return
    if args.setup:
        setup()
        return

    from reasonrl.model.load import default_model_dir

    model_dir = str(default_model_dir())
    trl_python = str(TRL_VENV / "bin" / "python")
    import importlib.util

    vllm = ["reasonrl-vllm"] if args.engine != "vllm" and importlib.util.find_spec("vllm") else []
    base = ["reasonrl-base"] if args.base else []
    fp32_trl = ["trl-fp32"] if args.precision != "fp32" else []
    wanted = args.only or ["reasonrl", *base, *vllm, "trl-matched", "trl-defaults", *fp32_trl]
    if "trl-fp32" in wanted and args.precision == "fp32":
        raise SystemExit("[bench] trl-fp32 is trl-matched when --precision is fp32: ask for trl-matched")
    if "reasonrl-base" in wanted and not args.base:
        raise SystemExit("[bench] reasonrl-base needs --base FOLDER (a checkout of the code to compare)")
    if any(w.startswith("trl") for w in wanted) and not Path(trl_python).exists():
        raise SystemExit(f"[bench] no TRL environment: run `python {Path(__file__).name} --setup` first")
    same = ["--precision", args.precision]
    setups = {"reasonrl": (sys.executable, ["--side", "reasonrl", "--engine", args.engine, *same]),
              "reasonrl-base": (sys.executable, ["--side", "reasonrl", "--engine", args.engine, *same]),
              "reasonrl-vllm": (sys.executable, ["--side", "reasonrl", "--engine", "vllm", *same]),
              "trl-matched": (trl_python, ["--side", "trl-matched", *same]),
              "trl-defaults": (trl_python, ["--side", "trl", *same]),
              "trl-fp32": (trl_python, ["--side", "trl-matched", "--precision", "fp32"])}
    results: dict[str, list[dict]] = {w: [] for w in wanted}
    from reasonrl.accel.calibrate import cpu_flags, cpu_model

    print(f"[bench] {cpu_model()}, {os.cpu_count()} cores, flags {' '.join(cpu_flags()) or 'none'}; "
          f"load average {os.getloadavg()[0]:.2f}; {args.rounds} rounds x "
          f"{args.steps} steps of {WORK['prompts']} prompts x {WORK['n']} samples, <= "
          f"{WORK['max_new_tokens']} new tokens, {args.precision}; model {model_dir}", flush=True)
    for r in range(args.rounds):
        for name in wanted:
            python, extra = setups[name]
            t = time.perf_counter()
            code = Path(args.base).resolve() if name == "reasonrl-base" else REPO
            out = side(python, [*extra, "--steps", str(args.steps), "--model-dir", model_dir,
                                "--max-new-tokens", str(args.max_new_tokens)], code)
            results[name].append(out)
            times = ", ".join(f"{s['step']:.1f}" for s in out["steps"])
            print(f"[bench] round {r + 1} {name:12s}: steps {times} s; "
                  f"peak RSS {out['peak_rss_gib']:.2f} GiB; process {time.perf_counter() - t:.0f} s; "
                  f"settings {out['settings']}", flush=True)

    rows = [summarise(n, results[n], not args.keep_first) for n in wanted]
    print("\nper-step wall time (s) and stages (median s), peak RSS of the process"
          + ("" if args.keep_first else "; each run's first step (warm-up) left out"))
    header = (f"{'setup':14s} {'median':>7s} {'min':>7s} {'max':>7s} {'n':>3s} {'rollout':>8s} "
              f"{'reward':>7s} {'update':>7s} {'tokens':>7s} {'load':>5s} {'RSS GiB':>8s}")
    print(header)
    print("-" * len(header))
    for s in rows:
        print(f"{s['name']:14s} {s['median']:7.1f} {s['min']:7.1f} {s['max']:7.1f} {s['n']:3d} "
              f"{s['rollout']:8.1f} {s['reward']:7.2f} {s['update']:7.1f} {s['tokens']:7.0f} "
              f"{s['load']:5.2f} {s['rss']:8.2f}")
    by = {s["name"]: s for s in rows}
    for ours in ("reasonrl", "reasonrl-vllm"):
        for other in ("reasonrl-base", "trl-matched", "trl-defaults", "trl-fp32"):
            if ours in by and other in by:
                a, o = by[ours], by[other]
                print(f"{ours} / {other}: step time {a['median'] / o['median']:.2f}x, "
                      f"rollout {a['rollout'] / o['rollout']:.2f}x, update "
                      f"{a['update'] / o['update']:.2f}x, peak RSS {a['rss'] / o['rss']:.2f}x")


if __name__ == "__main__":
    main()
