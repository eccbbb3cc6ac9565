"""Rollout engines side by side: the HF (transformers) engine, each of its decoders, and vLLM.

Engines: `hf` is the HF engine as a run uses it (`rollout.hf_decoder=auto`: the decoder
measured fastest on this machine, `reasonrl.accel.calibrate`); `hf-lean-mkl`, `hf-lean` and
`hf-modules` force one decoder each (`lean_mkl`, `lean`, `modules`); `vllm`.

For each engine, in its own process (so peak RSS is the engine's own), prints:
- start-up: model load, and for vLLM `import vllm` and the engine's start (writing the
  weights to a temporary folder, `LLM(...)`, the start probe);
- generation throughput: P prompts x n samples x up to T new tokens at temperature 1,
  generated tokens / wall seconds, after one warm-up call (median of --repeats calls);
- weight sync as the trainer does it after each update (push of all weights, checksum
  check, and for vLLM the probe log-prob check), median of 3, after perturbing the weights;
- for vLLM, |engine - policy| over the sampled tokens' log-probs (policy: fp32 forward);
- peak RSS of the process.

Usage: `python bench/rollout.py [--model tiny|PATH] [--engines hf,hf-lean-mkl,hf-lean,hf-modules,vllm]
[--prompts 8 --n 4 --tokens 128] [--threads 2]`. Default: the embedded SmolLM2-135M-Instruct, 8 x 4 x 128 (the
issue's "32 x 128"). The load average is printed with the figures: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DECODERS = {"hf-lean-mkl": "lean_mkl", "hf-lean": "lean", "hf-modules": "modules"}  # hf: auto
QUESTIONS = [f"What is {a} + {b}? Explain briefly." for a, b in
             [(3, 4), (12, 7), (25, 17), (9, 9), (40, 2), (11, 30), (6, 13), (18, 5),
              (2, 2), (33, 44), (7, 8), (19, 0), (5, 15), (14, 14), (21, 3), (1, 38)]]


def measure(engine_name: str, args: argparse.Namespace) -> dict:
    import torch

    from reasonrl.batch import Example
    from reasonrl.config import RolloutConfig
    from reasonrl.data import render_prompt
    from reasonrl.model.load import load_model_and_tokenizer
    from reasonrl.rollout import RolloutWorker, SamplingParams, make_engine
    from reasonrl.workers.policy import PolicySettings, PolicyWorker

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    out: dict = {"engine": engine_name, "threads": torch.get_num_threads()}
    t = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(args.model, torch.float32)
    out["load_model_s"] = time.perf_counter() - t
    if engine_name == "vllm":
        t = time.perf_counter()
        import vllm  # noqa: F401

        out["import_s"] = time.perf_counter() - t
    options = RolloutConfig(hf_decoder=DECODERS.get(engine_name, "auto"))
    options.vllm.enforce_eager = not args.compiled
    t = time.perf_counter()
    engine = make_engine("hf" if engine_name.startswith("hf") else engine_name, model, tokenizer, options,
                         args.threads)
    out["engine_start_s"] = time.perf_counter() - t
    policy = PolicyWorker(model, tokenizer.pad_token_id, PolicySettings())
    worker = RolloutWorker(engine, tokenizer)

    questions = (QUESTIONS * (args.prompts // len(QUESTIONS) + 1))[: args.prompts]
    prompts = [tokenizer(render_prompt(Example(q, ""), tokenizer, True, ""), add_special_tokens=False)
               ["input_ids"] for q in questions]
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.tokens)
    torch.manual_seed(0)
    engine.generate(prompts, params)  # warm-up
    rates, tokens = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        gen = engine.generate(prompts, params)
        seconds = time.perf_counter() - t
        count = sum(len(c) for c in gen.completion_ids)
        rates.append(count / seconds)
        tokens.append(count)
    out.update(tokens_per_s=statistics.median(rates), tokens_per_call=statistics.median(tokens),
               truncated_frac=sum(gen.truncated) / len(gen.truncated))
    if hasattr(engine, "last_path"):
        out["decoder"] = engine.last_path
    if gen.logprobs is not None:
        rows = [p for p in prompts for _ in range(args.n)]
        expected = policy.row_logprobs(model, rows, gen.completion_ids)
        diffs = torch.cat([(a - b).abs() for a, b in zip(gen.logprobs, expected, strict=True)])
        out.update(logprob_diff_mean=diffs.mean().item(), logprob_diff_max=diffs.max().item())

    syncs = []
    with torch.no_grad():
        for version in range(1, 4):
            for p in model.parameters():  # a stand-in for an optimizer step
                p.add_(1e-4 * torch.randn_like(p))
            t = time.perf_counter()
            probe = worker.probe_due()
            worker.load_weights(policy.named_weights(), version=version,
                                expected_checksum=policy.weights_checksum(),
                                expected_probe=None if probe is None else policy.probe_logprobs(probe))
            syncs.append(time.perf_counter() - t)
    out["sync_s"] = statistics.median(syncs)
    if engine_name == "vllm":
        t = time.perf_counter()
        engine.load_weights(policy.named_weights())
        out["push_only_s"] = time.perf_counter() - t
        engine.close()
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="'' = embedded SmolLM2-135M-Instruct, tiny, or an HF folder")
    ap.add_argument("--engines", default="hf,vllm",
                    help="of hf (auto decoder), hf-lean-mkl, hf-lean, hf-modules, vllm")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="0 = one per core")
    ap.add_argument("--compiled", action="store_true", help="vLLM with torch.compile (slow start)")
    ap.add_argument("--only", help=argparse.SUPPRESS)  # internal: measure one engine, print JSON
    args = ap.parse_args()
    if args.only:
        print("BENCH " + json.dumps(measure(args.only, args)), flush=True)
        return 0
    print(f"[bench] load average before: {os.getloadavg()}", flush=True)
    results = []
    for name in args.engines.split(","):
        argv = [sys.executable, __file__, "--only", name] + [
            f"--{k}={v}" for k, v in vars(args).items()
            if k not in ("only", "engines", "compiled") and v is not None]
        if args.compiled:
            argv.append("--compiled")
        t = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("BENCH ")), None)
        if proc.returncode != 0 or line is None:
            print(f"[bench] {name} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
            return 1
        result = json.loads(line[6:])
        result["process_s"] = time.perf_counter() - t
        results.append(result)
        print(f"[bench] {name}: {json.dumps(result)}", flush=True)
    print(f"[bench] load average after: {os.getloadavg()}")
    from reasonrl.accel.calibrate import cpu_model

    print(f"[bench] CPU: {cpu_model()}, {os.cpu_count()} cores")
    print(f"\n{args.prompts} prompts x {args.n} samples x up to {args.tokens} tokens, T=1, "
          f"model {args.model or 'SmolLM2-135M-Instruct'}, fp32")
    print(f"{'decoder':20}" + "".join(f"{r.get('decoder', '-'):>14}" for r in results))
    keys = ["threads", "tokens_per_s", "tokens_per_call", "truncated_frac", "load_model_s", "import_s",
            "engine_start_s", "sync_s", "push_only_s", "logprob_diff_mean", "logprob_diff_max",
            "peak_rss_gib", "process_s"]
    print(f"{'':20}" + "".join(f"{r['engine']:>14}" for r in results))
    for k in keys:
        cells = [r.get(k) for r in results]
        if all(c is None for c in cells):
            continue
        print(f"{k:20}" + "".join(f"{'-':>14}" if c is None else f"{c:>14.4g}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
