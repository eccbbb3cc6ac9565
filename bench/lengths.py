"""Response length vs memory and time: the length sweep of docs/performance.md.

    python bench/lengths.py                          # 64 / 256 / 512 / 1,024 new tokens, 3 steps each
    python bench/lengths.py --lengths 64 256 --base /tmp/before   # also another checkout, same work
    python bench/lengths.py --budgets                # one forward + backward per micro-batch size
    python bench/lengths.py --update-sweep --device cuda --dtypes float32 bfloat16   # a GPU

The sweep trains the default model on GSM8K questions from the repository's fixture
(`reward.task=math`, 4 prompts x 4 samples, `trainer.steps=3`, no evaluation) with
`rollout.max_new_tokens` raised, each run a fresh `reasonrl train` process, and prints per
length: trained tokens per step (`train/tokens`), update seconds per step, milliseconds per
trained token, rollout tokens/s, micro-batches per update and their padding
(`train/pad_fraction`), and the process's peak RSS (`wait4`'s ru_maxrss: the trainer, not its
reward workers). Steps after the first count (the first pays the decoder calibration).

`--budgets` times one forward + backward of the default model on micro-batches of 256 .. 8,192
positions (rows of 512 tokens, or shorter rows for the small budgets), in milliseconds per
position and peak RSS growth, and the same positions packed into one sequence with a
block-diagonal mask (what packing costs without a variable-length attention kernel): the
measurement behind the CPU's auto budget (reasonrl/model/budget.py).

`--update-sweep` times the update alone (`PolicyWorker.train_step`) on a random-weight model of
the default model's shape, random tokens, with and without the token budget: for a GPU, where
no weights or tokenizer need to reach the machine.

Figures depend on the machine: the CPU model and the load average are printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "gsm8k"
WORK = ["data.task=file", f"data.train_path={FIXTURE / 'train.jsonl'}",
        f"data.val_path={FIXTURE / 'test.jsonl'}", "data.format=gsm8k", "reward.task=math",
        "trainer.steps=3", "trainer.eval_every=0", "trainer.batch_size=16", "rollout.n=4",
        "trainer.progress=false"]


def train(code: Path, length: int, extra: list[str]) -> dict:
    """One `reasonrl train` of the work at `length` new tokens with reasonrl from `code`:
    its per-step metrics (after the first step) and peak RSS."""
    with tempfile.TemporaryDirectory(prefix="lengths-") as tmp:  # the run's checkpoints: ~1.6 GB
        out = Path(tmp)
        args = [sys.executable, "-m", "reasonrl.cli", "train", str(REPO / "configs" / "default.yaml"), *WORK,
                f"rollout.max_new_tokens={length}", f"trainer.output_dir={out}", "trainer.run_name=run",
                *extra]
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": str(code)}
        load = os.getloadavg()[0]
        start = time.perf_counter()
        proc = subprocess.Popen(args, cwd=code, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        stderr = proc.stderr.read().decode(errors="replace")
        if status != 0:
            sys.stderr.write(stderr[-3000:])
            raise SystemExit(f"[lengths] {length} tokens ({code}) failed with status {status}")
        rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "time/update" in r][1:]

    def median(key: str) -> float:
        values = [r[key] for r in steps if key in r]
        return statistics.median(values) if values else float("nan")

    tokens, update = median("train/tokens"), median("time/update")
    return {"length": length, "tokens": tokens, "update_s": update, "ms_per_token": 1e3 * update / tokens,
            "rollout_s": median("time/rollout"), "rollout_tok_s": median("rollout/tokens_per_s"),
            "micro_batches": median("train/micro_batches"), "pad": median("train/pad_fraction"),
            "rss_gib": usage.ru_maxrss / 2**20, "wall_s": time.perf_counter() - start, "load": load}


def sweep(lengths: list[int], setups: dict[str, Path], extra: list[str]) -> None:
    results = []
    for length in lengths:
        for name, code in setups.items():
            r = {"setup": name, **train(code, length, extra)}
            results.append(r)
            print(f"[lengths] {name} {length:5d} tokens: {r['tokens']:.0f} trained tokens/step, update "
                  f"{r['update_s']:.1f} s ({r['ms_per_token']:.2f} ms/token), rollout {r['rollout_s']:.1f} s "
                  f"({r['rollout_tok_s']:.0f} tok/s), {r['micro_batches']:.0f} micro-batches, "
                  f"padding {r['pad']:.1%}, peak RSS {r['rss_gib']:.2f} GiB, process {r['wall_s']:.0f} s, "
                  f"load {r['load']:.2f}", flush=True)
    print("\n| setup | max_new_tokens | trained tokens / step | update s / step | ms per trained token "
          "| rollout tok/s | micro-batches | padding | peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['setup']} | {r['length']} | {r['tokens']:.0f} | {r['update_s']:.1f} "
              f"| {r['ms_per_token']:.2f} | {r['rollout_tok_s']:.0f} | {r['micro_batches']:.0f} "
              f"| {r['pad']:.1%} | {r['rss_gib']:.2f} GiB |")


def budgets(sizes: list[int], row_tokens: int, packed_max: int = 4096) -> None:
    """Forward + backward ms per position at each micro-batch size, rows of `row_tokens`
    (fewer when the budget is smaller), and, up to `packed_max` positions (its mask alone is
    positions^2 floats), the same rows packed into one sequence with a block-diagonal mask and
    positions restarting per row."""
    import torch

    from reasonrl.accel import TrainingAccel
    from reasonrl.model.load import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(None)
    TrainingAccel(model, kernels=True)
    model.train()
    gen = torch.Generator().manual_seed(0)

    def timed(ids: torch.Tensor, **kw) -> float:
        best = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            hidden = model.get_decoder()(input_ids=ids, use_cache=False, **kw).last_hidden_state
            hidden.float().pow(2).mean().backward()
            best = min(best, time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
        return best

    print("| positions | rows x tokens | ms per position (per-length group) | ms per position (packed, "
          "block-diagonal) | peak RSS so far |")
    print("|---|---|---|---|---|")
    for size in sizes:
        length = min(row_tokens, size)
        rows = size // length
        ids = torch.randint(0, model.config.vocab_size, (rows, length), generator=gen)
        grouped = timed(ids)
        packed = float("nan")
        if 1 < rows and size <= packed_max:  # one sequence of all rows, each attending only to itself
            block = torch.block_diag(*[torch.ones(length, length).tril() for _ in range(rows)]).bool()
            mask = torch.zeros(size, size).masked_fill(~block, float("-inf"))[None, None]
            positions = torch.arange(length).repeat(rows)[None]
            packed = timed(ids.reshape(1, size), attention_mask=mask, position_ids=positions)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"| {size} | {rows} x {length} | {1e3 * grouped / size:.3f} | {1e3 * packed / size:.3f} "
              f"| {rss:.2f} GiB |", flush=True)


def release(device) -> None:
    """Give a finished setup's memory back before the next one is measured (the learner's
    optimizer hooks hold reference cycles: only the collector frees them)."""
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def update_sweep(lengths: list[int], device: str, dtypes: list[str], config_path: str | None,
                 budgets: list[int]) -> None:
    """The update alone on `device`, on a random-weight model of the default model's shape (or
    `config_path`'s): 4 prompts of 150 tokens x 4 completions of L/2..L random tokens per step,
    `optim.micro_batch_size=16`, each token budget of `budgets` (0 = auto, -1 = no budget: the
    row cap alone, as before the budget existed). Prints trained tokens/s and peak memory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from reasonrl.batch import TrainBatch
    from reasonrl.config import OptimConfig
    from reasonrl.model.load import default_model_dir
    from reasonrl.workers.policy import PolicySettings, PolicyWorker

    config = AutoConfig.from_pretrained(config_path or str(default_model_dir()))
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    print("| dtype | max_new_tokens | budget | trained tokens / step | update s / step | tokens/s "
          "| micro-batches | peak memory |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in dtypes:
        for length in lengths:
            prompts = [torch.randint(0, config.vocab_size, (150,), generator=gen).tolist() for _ in range(4)]
            prompt_ids = [p for p in prompts for _ in range(4)]
            sizes = torch.randint(length // 2, length + 1, (16,), generator=gen).tolist()
            completion_ids = [torch.randint(0, config.vocab_size, (n,), generator=gen).tolist()
                              for n in sizes]
            advantages = torch.randn(16, generator=gen)
            for budget in budgets:
                torch.manual_seed(0)
                model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).to(dev)
                optim = OptimConfig(lr=1e-6, micro_batch_size=16,
                                    max_tokens_per_micro_batch=max(budget, 0) if budget >= 0 else 10**9)
                worker = PolicyWorker(model, 0, PolicySettings(optim=optim, max_response_length=length))
                if dev.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(dev)
                times = []
                name = {0: f"auto ({worker.learner.max_tokens})", -1: "none (rows only)"}.get(
                    budget, str(budget))
                try:
                    for _ in range(3):
                        if dev.type == "cuda":
                            torch.cuda.synchronize(dev)
                        start = time.perf_counter()
                        worker.train_step(TrainBatch(prompt_ids, completion_ids, advantages))
                        if dev.type == "cuda":
                            torch.cuda.synchronize(dev)
                        times.append(time.perf_counter() - start)
                except torch.OutOfMemoryError:
                    times = []
                if not times or len(times) < 3:
                    print(f"| {dtype} | {length} | {name} | {sum(sizes)} | out of memory | | | |", flush=True)
                    del worker, model
                    release(dev)
                    continue
                seconds = statistics.median(times[1:])
                peak = (torch.cuda.max_memory_allocated(dev) if dev.type == "cuda"
                        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 2**30
                layout = worker.learner.micro_batches(prompt_ids, completion_ids)
                positions = sum(mb.computed_tokens for mb in layout)
                print(f"| {dtype} | {length} | {name} | {sum(sizes)} | {seconds:.3f} "
                      f"| {sum(sizes) / seconds:.0f} | {len(layout)} ({positions} positions) "
                      f"| {peak:.2f} GiB |", flush=True)
                del worker, model
                release(dev)


def main() -> None:
    parser = argparse.ArgumentParser(description="response length vs memory and time")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 512, 1024])
    parser.add_argument("--base", metavar="FOLDER", help="another checkout of reasonrl, run on the same work")
    parser.add_argument("--only-base", action="store_true", help="run only --base's code")
    parser.add_argument("--budgets", action="store_true", help="time micro-batch sizes instead of the sweep")
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    parser.add_argument("--row-tokens", type=int, default=512)
    parser.add_argument("--update-sweep", action="store_true",
                        help="the update alone on a random-weight model (a GPU: --device cuda)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtypes", nargs="+", default=["float32"])
    parser.add_argument("--config", help="a model's config.json folder (default: the default model's)")
    parser.add_argument("--budget-values", type=int, nargs="+", default=[-1, 0],
                        help="token budgets for --update-sweep: 0 = auto, -1 = none (rows only)")
    parser.add_argument("overrides", nargs="*", help="more key=value overrides for every run")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from reasonrl.accel.calibrate import cpu_model

    print(f"[lengths] {cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}",
          flush=True)
    if args.budgets:
        budgets(args.sizes, args.row_tokens)
        return
    if args.update_sweep:
        update_sweep(args.lengths, args.device, args.dtypes, args.config, args.budget_values)
        return
    setups = {} if args.only_base else {"this": REPO}
    if args.base:
        setups["base"] = Path(args.base).resolve()
    sweep(args.lengths, setups, args.overrides)


if __name__ == "__main__":
    main()
