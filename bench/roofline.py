"""How close does reasonrl come to what this machine can do?

Measures, and prints:
0. the CPU's model name and the flags that decide bf16's speed (x86: amx_bf16, amx_tile,
   avx512_bf16, avx512f, avx2, fma; ARM: bf16, sve, asimd), as `reasonrl.accel.calibrate`
   reads them for its measured choices;
1. the machine's matmul throughput (GFLOP/s) in fp32 and bf16 and their ratio, on a square
   matrix and on the matrix products of SmolLM2-135M (hidden 576, intermediate 1536, vocab
   49152, 9 query / 3 key-value heads of 64) as the model calls them, `F.linear(x, W)` with W
   [out, in] as nn.Linear stores it: a training micro-batch's 4096 rows (the forward, the
   input and weight gradients of the MLP, attention's scores) and decode's 32 rows. The
   third column is bf16 autocast on fp32 tensors (what `bf16-mixed` computes: the casts of x
   and W are paid in every call); `F.linear` at decode's small batch with the weight as
   stored by nn.Linear and stored transposed; the memory bandwidth (GB/s, a large copy);
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


def linear_gflops(m: int, k: int, n: int, mode: str, weight_gradient: bool = False) -> float:
    """`F.linear(x, W)` = x @ W^T, x [m, k] and W [n, k] as nn.Linear stores it, in `mode`: fp32,
    bf16 (both tensors bf16) or autocast (fp32 tensors under CPU bf16 autocast: the casts are
    counted). `weight_gradient` lays the operands out as autograd's weight gradient does,
    grad_W = grad_y^T @ x with grad_y [rows, out] and x [rows, in] both row-major: x here is
    the transposed view of a [k, m] tensor and W^T a row-major [k, n] one."""
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    x = (torch.randn(k, m).t() if weight_gradient else torch.randn(m, k)).to(dtype)
    w = (torch.randn(k, n).t() if weight_gradient else torch.randn(n, k)).to(dtype)
    if mode == "autocast":
        def fn():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return torch.nn.functional.linear(x, w)
    else:
        def fn():
            return torch.nn.functional.linear(x, w)
    return 2 * m * k * n / best_time(fn) / 1e9


def attention_gflops(batch: int, heads: int, q: int, kv: int, head_dim: int, mode: str) -> float:
    """The score product Q K^T, [batch*heads, q, d] @ [batch*heads, d, kv] (the A V product has
    the same FLOPs), in `mode` as in `linear_gflops`."""
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    a = torch.randn(batch * heads, q, head_dim).to(dtype)
    b = torch.randn(batch * heads, kv, head_dim).to(dtype).transpose(1, 2)
    if mode == "autocast":
        def fn():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return torch.bmm(a, b)
    else:
        def fn():
            return torch.bmm(a, b)
    return 2 * batch * heads * q * kv * head_dim / best_time(fn) / 1e9


# SmolLM2-135M's products: (name, rows, in, out, weight-gradient layout); rows = tokens of a micro-batch or
# decode's batch. Training's backward runs each forward product twice more: the input gradient
# (grad_y [rows, out] @ W: the same FLOPs as an out -> in linear) and the weight gradient
# (grad_y^T @ x: `out` rows over a reduction of `rows`).
HIDDEN, INTER, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 576, 1536, 49152, 9, 3, 64
TRAIN_ROWS, DECODE_ROWS = 4096, 32
MODES = ("fp32", "bf16", "autocast")
LINEAR_SHAPES = [
    ("train q/o   576 -> 576", TRAIN_ROWS, HIDDEN, HIDDEN, False),
    ("train k/v   576 -> 192", TRAIN_ROWS, HIDDEN, KV_HEADS * HEAD_DIM, False),
    ("train up    576 -> 1536", TRAIN_ROWS, HIDDEN, INTER, False),
    ("train down  1536 -> 576", TRAIN_ROWS, INTER, HIDDEN, False),
    ("train lm head 576 -> 49152", TRAIN_ROWS, HIDDEN, VOCAB, False),
    ("grad_W up   [1536x4096]@[4096x576]", INTER, TRAIN_ROWS, HIDDEN, True),
    ("decode q/o  576 -> 576", DECODE_ROWS, HIDDEN, HIDDEN, False),
    ("decode k/v  576 -> 192", DECODE_ROWS, HIDDEN, KV_HEADS * HEAD_DIM, False),
    ("decode up   576 -> 1536", DECODE_ROWS, HIDDEN, INTER, False),
    ("decode down 1536 -> 576", DECODE_ROWS, INTER, HIDDEN, False),
    ("decode lm head 576 -> 49152", DECODE_ROWS, HIDDEN, VOCAB, False),
]


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

    from reasonrl.accel.calibrate import CHOICE_FLAGS, cpu_flags, cpu_model
    from reasonrl.batch import TrainBatch
    from reasonrl.config import OptimConfig
    from reasonrl.model.load import load_model_and_tokenizer
    from reasonrl.rollout import SamplingParams
    from reasonrl.rollout.hf import HFEngine
    from reasonrl.workers.policy import PolicySettings, PolicyWorker

    torch.set_num_threads(os.cpu_count() or 1)
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}")
    print(f"flags: {' '.join(cpu_flags()) or 'none'} (of {' '.join(CHOICE_FLAGS)})")
    print("\n== matmul throughput (GFLOP/s, best of 5); autocast = fp32 tensors under CPU bf16 autocast ==")
    print(f"  {'':40s} {'fp32':>7s} {'bf16':>7s} {'bf16/fp32':>9s} {'autocast':>8s} {'autocast/fp32':>13s}")

    def row(name: str, fp32: float, bf16: float, auto: float | None) -> None:
        tail = f" {auto:8.1f} {auto / fp32:12.2f}x" if auto is not None else ""
        print(f"  {name:40s} {fp32:7.1f} {bf16:7.1f} {bf16 / fp32:8.2f}x{tail}")

    square = (matmul_gflops(2048, 2048, 2048, torch.float32), matmul_gflops(2048, 2048, 2048, torch.bfloat16))
    row("square 2048 (a @ b)", *square, None)
    peak, peak_bf16 = square
    for name, m, k, n, weight_gradient in LINEAR_SHAPES:
        fp32, bf16, auto = (linear_gflops(m, k, n, mode, weight_gradient) for mode in MODES)
        row(name if weight_gradient else f"{name} ({m} rows)", fp32, bf16, auto)
        if not name.startswith("decode"):
            peak, peak_bf16 = max(peak, fp32), max(peak_bf16, bf16)
    batch, seq = TRAIN_ROWS // 128, 128
    row(f"train attention QK^T {batch}x{HEADS} heads, {seq}^2",
        *(attention_gflops(batch, HEADS, seq, seq, HEAD_DIM, mode) for mode in MODES))
    row(f"decode attention QK^T {DECODE_ROWS}x{HEADS}, 1x192",
        *(attention_gflops(DECODE_ROWS, HEADS, 1, 192, HEAD_DIM, mode) for mode in MODES))
    print(f"  best training product: fp32 {peak:.1f}, bf16 {peak_bf16:.1f} GFLOP/s ({peak_bf16 / peak:.2f}x)")
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
