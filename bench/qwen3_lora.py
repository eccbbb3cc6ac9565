"""Qwen3 and LoRA on the fast path: decode tokens/s and update seconds, lean against the
transformers modules, on one machine in one run (ratios within the run; the load is printed).

Two models:
- `qwen3`: a random-weight model of Qwen3-0.6B's shape (vocab 151,936, hidden 1,024, 28 layers,
  16 query heads on 8 key/value heads of 128, intermediate 3,072, tied head; nothing downloaded);
- `smollm2-lora`: the embedded SmolLM2-135M-Instruct with LoRA rank 16 on every projection.

Decode: the HF engine with each decoder (`lean_mkl` where MKL packs, `lean`, `modules`), P prompts
x n samples x T new tokens at temperature 1, one warm-up call each, then --repeats calls
interleaved (A B C A B C); the least wall time per decoder. A LoRA run's engine serves a plain
copy of the model that each sync refreshes with the merged weights (`reasonrl.placement`): its
lean figure is that copy's; `modules (adapters applied)` decodes the peft-wrapped model itself,
the alternative of applying the adapters at decode time, and `sync` is what the merged copy costs
per step (merge + copy into the engine's model).

Update: one forward and backward of the policy's loss over R rows of L positions, with the lean
training kernels (`optim.lean_kernels`) and without, interleaved, least of --repeats.

Usage: python bench/qwen3_lora.py [--models qwen3,smollm2-lora] [--prompts 4 --n 4 --tokens 32]
[--rows 4 --length 96] [--repeats 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from types import SimpleNamespace

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def qwen3_06b_shape():
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                         max_position_embeddings=40960, rope_theta=1000000.0, tie_word_embeddings=True,
                         eos_token_id=151645, pad_token_id=151643)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config)
    return model.eval(), SimpleNamespace(eos_token_id=151645, pad_token_id=151643)


def decode_seconds(engines: dict, prompts: list[list[int]], params, repeats: int) -> dict[str, float]:
    """The least seconds of a `generate` call per engine, after one warm-up call each,
    interleaved round by round; also the tokens generated (the same for every engine: one seed)."""
    import torch

    best = {name: float("inf") for name in engines}
    tokens = {}
    for r in range(repeats + 1):
        for name, engine in engines.items():
            torch.manual_seed(0)
            start = time.perf_counter()
            out = engine.generate(prompts, params)
            seconds = time.perf_counter() - start
            tokens[name] = sum(len(c) for c in out.completion_ids)
            if r:
                best[name] = min(best[name], seconds)
    return {name: tokens[name] / best[name] for name in engines}


def update_seconds(model, rows: int, length: int, repeats: int, vocab: int) -> dict[str, float]:
    """Least seconds of one forward + backward of a token-mean NLL over rows x length random
    ids, without the lean kernels, then with them (swapped in place between the two)."""
    import torch
    import torch.nn.functional as F

    from reasonrl.accel.kernels import apply_lean_kernels

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, length), generator=gen)
    model.train()

    def once() -> float:
        start = time.perf_counter()
        logits = model(input_ids=ids).logits[:, :-1].float()
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
        loss.backward()
        seconds = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return seconds

    out = {}
    once()  # warm-up
    out["modules"] = min(once() for _ in range(repeats))
    swapped = apply_lean_kernels(model)
    once()
    out["lean kernels"] = min(once() for _ in range(repeats))
    out["swapped"] = ", ".join(swapped)
    return out


def run_model(name: str, args) -> None:
    import torch

    from reasonrl.accel.lean_decode import mkl_packing
    from reasonrl.model.load import load_model_and_tokenizer
    from reasonrl.rollout import SamplingParams
    from reasonrl.rollout.hf import HFEngine

    t = time.perf_counter()
    if name == "qwen3":
        model, tokenizer = qwen3_06b_shape()
    else:
        model, tokenizer = load_model_and_tokenizer(None, torch.float32)
        model.eval()
    print(f"\n{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters, built in "
          f"{time.perf_counter() - t:.1f} s", flush=True)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, vocab, (48 + 8 * i,), generator=gen).tolist() for i in range(args.prompts)]
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.tokens)
    decoders = ("lean_mkl", "lean", "modules") if mkl_packing() else ("lean", "modules")
    engines = {d: HFEngine(model, tokenizer, decoder=d) for d in decoders}
    lora = None
    if name == "smollm2-lora":
        from reasonrl.model.lora import apply_lora

        lora = apply_lora(copy.deepcopy(model), 16, 32, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj",
                                                               "gate_proj", "up_proj", "down_proj"], seed=0)
        with torch.no_grad():  # adapters that change the output (B starts at zero)
            for n, p in lora.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.01, generator=gen)
        engines["modules (adapters applied)"] = HFEngine(lora, tokenizer, decoder="modules")
    rates = decode_seconds(engines, prompts, params, args.repeats)
    base = rates["modules"]
    print(f"decode, {args.prompts} prompts x {args.n} x {args.tokens} tokens (load "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores):", flush=True)
    for d, rate in rates.items():
        print(f"  {d:<28} {rate:8.1f} tokens/s  {rate / base:5.2f}x modules", flush=True)
    if lora is not None:
        spare = copy.deepcopy(lora)  # merging unloads the adapters: the update below needs them
        start = time.perf_counter()
        state = spare.merge_and_unload().state_dict()
        with torch.no_grad():
            for key, p in model.state_dict().items():
                p.copy_(state[key])
        print(f"  sync of the merged copy (merge + copy): {time.perf_counter() - start:.2f} s per step",
              flush=True)
    target = lora if lora is not None else model
    seconds = update_seconds(target, args.rows, args.length, args.repeats, vocab)
    print(f"update, {args.rows} rows x {args.length} positions, forward + backward (load "
          f"{os.getloadavg()[0]:.2f}): modules {seconds['modules']:.2f} s, lean kernels "
          f"{seconds['lean kernels']:.2f} s ({seconds['modules'] / seconds['lean kernels']:.2f}x; "
          f"{seconds['swapped']})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="qwen3,smollm2-lora")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    import torch

    from reasonrl.accel.calibrate import cpu_model

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    print(f"{cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    for name in args.models.split(","):
        run_model(name, args)


if __name__ == "__main__":
    main()
