"""How close does reasonrl come to what this machine can do?

Measures, and prints:
1. the machine's matmul throughput (GFLOP/s) in fp32 and bf16, on square matrices and on the
   shapes of a SmolLM2-135M training step; `F.linear` at decode's small batch with the weight
   as stored by nn.Linear and stored transposed; the memory bandwidth (GB/s, a large copy);
2. the training update's achieved FLOP/s: one `PolicyWorker.train_step` on B sequences of
   P prompt + T completion tokens, FLOPs counted as 6 x (non-embedding parameters) per token
   (forward 2, backward 4; Kaplan et al. 2020, sec. 2.1) + the attention score terms, plus the
   LM head on the completion positions only (what reasonrl computes);
3. decode tokens/s of the HF rollout engine against the memory-bandwidth bound: each decode
   step of a batch of B sequences streams all weights once (fp32: 4 bytes/parameter), so
   tokens/s <= B * bandwidth / weight bytes (the KV cache, small at these lengths, is ignored,
   which makes the bound optimistic).

Usage: `python bench/roofline.py [--model tiny|PATH] [--batch 32] [--prompt 64] [--tokens 128]`.
The default model is the embedded SmolLM2-135M-Instruct. Run on an otherwise idle machine;
the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402


def best_time(fn, repeat: int = 5) -> float:
    fn()  # warm-up (oneDNN picks kernels, caches fill)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def matmul_gflops(m: int, k: int, n: int, dtype: torch.dtype) -> float:
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    return 2 * m * k * n / best_time(lambda: a @ b) / 1e9


def bandwidth_gbs(mbytes: int = 512) -> float:
    src = torch.empty(mbytes * 2**20 // 4)
    src.fill_(1.0)
    dst = torch.empty_like(src)
    seconds = best_time(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / seconds / 1e9  # read + write


def model_flops(config, batch: int, prompt: int, tokens: int) -> float:
    """FLOPs of one forward+backward of reasonrl's update on [batch, prompt+tokens]."""
    h, layers, inter, vocab = (config.hidden_size, config.num_hidden_layers,
                               config.intermediate_size, config.vocab_size)
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * inter  # q, o, k, v, gate/up/down
    seq = prompt + tokens
    dense = 6 * layers * per_layer * batch * seq
    attention = 6 * layers * 2 * h * seq * seq / 2 * batch  # QK^T and AV, causal half
    head = 6 * h * vocab * batch * tokens  # LM head on completion positions only
    return dense + attention + head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="", help="'' = SmolLM2-135M-Instruct, tiny, or an HF folder")
    parser.add_argument("--batch", type=int, default=32, help="sequences per update and per decode batch")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens per sequence")
    parser.add_argument("--tokens", type=int, default=128, help="completion tokens per sequence")
    parser.add_argument("--micro-batch", type=int, default=8)
    args = parser.parse_args()

    from reasonrl.batch import TrainBatch
    from reasonrl.config import OptimConfig
    from reasonrl.policy.model import load_model_and_tokenizer
    from reasonrl.policy.worker import PolicySettings, PolicyWorker
    from reasonrl.rollout import SamplingParams
    from reasonrl.rollout.hf import HFEngine

    torch.set_num_threads(os.cpu_count() or 1)
    print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}")
    print("\n== matmul throughput (GFLOP/s, best of 5) ==")
    cfg_shapes = [("square 2048", 2048, 2048, 2048),
                  ("q/o proj  [4096x576]@[576x576]", 4096, 576, 576),
                  ("mlp up    [4096x576]@[576x1536]", 4096, 576, 1536),
                  ("lm head   [4096x576]@[576x49152]", 4096, 576, 49152),
                  ("decode    [32x576]@[576x1536]", 32, 576, 1536)]
    peak = 0.0
    for name, m, k, n in cfg_shapes:
        fp32 = matmul_gflops(m, k, n, torch.float32)
        bf16 = matmul_gflops(m, k, n, torch.bfloat16)
        peak = max(peak, fp32)
        print(f"  {name:34s} fp32 {fp32:7.1f}   bf16 {bf16:7.1f}")
    print("  weight layout at decode's batch of 32 (why the HF engine decodes with transposed weights):")
    for name, k, n in [("mlp up   576 -> 1536", 576, 1536), ("mlp down 1536 -> 576", 1536, 576),
                       ("lm head  576 -> 49152", 576, 49152)]:
        x, w = torch.randn(32, k), torch.randn(n, k)
        w_t = w.t().contiguous().t()  # same values, column-major storage
        flops = 2 * 32 * k * n / 1e9
        plain = flops / best_time(lambda x=x, w=w: torch.nn.functional.linear(x, w))
        transposed = flops / best_time(lambda x=x, w_t=w_t: torch.nn.functional.linear(x, w_t))
        print(f"    {name:24s} F.linear(x, W) {plain:6.1f}   with W stored transposed {transposed:6.1f}")
    bw = bandwidth_gbs()
    print(f"  memory bandwidth (512 MiB copy): {bw:.1f} GB/s")

    model, tokenizer = load_model_and_tokenizer(args.model or None)
    params = sum(p.numel() for p in model.parameters())
    flops = model_flops(model.config, args.batch, args.prompt, args.tokens)
    worker = PolicyWorker(model, tokenizer.pad_token_id,
                          PolicySettings(optim=OptimConfig(lr=1e-7, micro_batch_size=args.micro_batch)))
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (args.prompt,), generator=generator).tolist()
               for _ in range(args.batch)]
    completions = [torch.randint(0, vocab, (args.tokens,), generator=generator).tolist()
                   for _ in range(args.batch)]
    advantages = torch.randn(args.batch, generator=generator)
    batch = TrainBatch(prompts, completions, advantages)
    seconds = best_time(lambda: worker.train_step(batch), repeat=2)
    print(f"\n== training update: {args.batch} x ({args.prompt} + {args.tokens}) tokens, "
          f"micro-batch {args.micro_batch}, {params / 1e6:.1f}M parameters ==")
    print(f"  {seconds:.2f} s, {flops / 1e12:.2f} TFLOP -> {flops / seconds / 1e9:.1f} GFLOP/s = "
          f"{flops / seconds / 1e9 / peak:.0%} of the best fp32 matmul ({peak:.1f} GFLOP/s)")

    engine = HFEngine(model, tokenizer)
    sampling = SamplingParams(n=1, temperature=1.0, max_new_tokens=args.tokens)
    eos = set(engine.eos_ids)
    engine.eos_ids = set()  # decode exactly `tokens` per row: the work is fixed
    t = time.perf_counter()
    gen = engine.generate(prompts, sampling)
    seconds = time.perf_counter() - t
    engine.eos_ids = eos
    produced = sum(len(c) for c in gen.completion_ids)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bound = args.batch * bw * 1e9 / weight_bytes
    print(f"\n== decode: HF engine, batch {args.batch}, {args.tokens} new tokens ==")
    print(f"  {produced} tokens in {seconds:.1f} s = {produced / seconds:.0f} tokens/s; "
          f"memory-bandwidth bound {bound:.0f} tokens/s ({weight_bytes / 1e6:.0f} MB of weights per "
          f"step) -> {produced / seconds / bound:.0%} of the bound")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
