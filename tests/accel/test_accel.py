"""reasonrl.accel, the CPU fast paths: the lean decoder (with and without MKL packing), the
modules decoder, the lean training kernels and the memory layout, each against the
transformers / torch code it replaces (the calibration that picks a decoder:
test_calibrate.py). A transformers upgrade that changes the internals these paths rely on
fails here (and only here).

Tolerances: the fast paths compute the same sums in another order. For a float32 dot product
of n terms the reordering error is at most ~n * eps * sum|terms| (eps = 6e-8); the tiny
model's products have n <= 192 terms of size <= ~1, so logits agree to ~1e-5, and the
48-term random products of the matrix-layout test (sum|terms| <= ~40) to ~1e-4."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import REPO, grouped_rows, needs_peft
from torch import nn

from reasonrl.accel import calibrate
from reasonrl.accel import lean_decode as llama
from reasonrl.accel.kernels import (
    RMSNormFunction,
    SwiGLUDownFunction,
    SwiGLUFunction,
    apply_lean_kernels,
)
from reasonrl.accel.lean_decode import LeanLlama, _Matrix, unsupported_reason
from reasonrl.accel.modules import ModulesDecoder
from reasonrl.model.forward import completion_logprobs, make_micro_batches
from reasonrl.rollout import SamplingParams
from reasonrl.rollout.hf import HFEngine

MKL = llama.mkl_packing()
needs_mkl = pytest.mark.skipif(not MKL, reason="this torch has no MKL packed GEMM (not an x86 MKL build)")


@pytest.fixture(autouse=True)
def calibration_home(tmp_path, monkeypatch):
    """Each test calibrates into its own $REASONRL_HOME/calibration.json."""
    monkeypatch.setattr(calibrate, "cache_file", lambda: tmp_path / "calibration.json")


def tiny_qwen2(tokenizer, seed: int = 0):
    """A random Qwen2 (q/k/v biases, untied head, 4 query heads on 2 key/value heads)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():  # non-zero biases and norm weights, so a dropped one shows
            for name, p in model.named_parameters():
                if name.endswith("bias") or "norm" in name:
                    p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def tiny_qwen3(tokenizer, seed: int = 0):
    """A random Qwen3 (per-head query/key RMSNorms before RoPE, head_dim 32 set apart from
    hidden / heads, untied head, 4 query heads on 2 key/value heads)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         max_position_embeddings=512,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
        with torch.no_grad():  # norm weights away from 1, so a skipped query/key norm shows
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def arch_model(arch: str, tiny):
    model, tokenizer = tiny
    return {"llama": lambda: copy.deepcopy(model), "qwen2": lambda: tiny_qwen2(tokenizer),
            "qwen3": lambda: tiny_qwen3(tokenizer)}[arch]()


def left_padded(prompts: list[list[int]], pad: int):
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [100, 200, 300, 400, 500, 600, 700]]


# ------------------------------------------------------------------ the lean decoder


@pytest.mark.parametrize("mkl", [pytest.param(True, marks=needs_mkl), False])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_lean_decoder_logits_equal_the_transformers_modules(tiny, arch, mkl):
    """Both lean paths, MKL-packed and plain (the path of a machine without MKL: ARM, macOS),
    against the transformers modules, through prefill, repeat, select and steps."""
    model, tokenizer = arch_model(arch, tiny), tiny[1]
    model.eval()
    assert unsupported_reason(model) is None
    ids, mask = left_padded(PROMPTS, tokenizer.pad_token_id)
    steps = [torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([7, 8, 9, 10, 11, 12]),
             torch.tensor([13, 14, 15])]
    with torch.inference_mode():
        ref, lean = ModulesDecoder(model, 8), LeanLlama(model, ids.size(1) + 8, mkl=mkl)
        assert lean.head.packable is mkl
        torch.testing.assert_close(lean.prefill(ids, mask), ref.prefill(ids, mask), atol=1e-5, rtol=1e-5)
        ref.repeat(2)
        lean.repeat(2)
        for t, tokens in enumerate(steps):
            if t == 2:  # rows 1, 2 and 4 go on: the cache, positions and masks follow them
                keep = torch.tensor([1, 2, 4])
                ref.select(keep)
                lean.select(keep)
            torch.testing.assert_close(lean.step(tokens), ref.step(tokens), atol=1e-5, rtol=1e-5)


def test_rows_leaving_in_place_or_reordered_keep_their_caches(tiny):
    """`select` with rows in increasing order moves them down in place (only the filled columns);
    in any other order it gathers a new cache: both give the modules' logits afterwards."""
    model, tokenizer = tiny
    model.eval()
    ids, mask = left_padded(PROMPTS, tokenizer.pad_token_id)
    with torch.inference_mode():
        ref, lean = ModulesDecoder(model, 8), LeanLlama(model, ids.size(1) + 8, mkl=False)
        ref.prefill(ids, mask)
        lean.prefill(ids, mask)
        ref.repeat(2)
        lean.repeat(2)
        tokens = torch.arange(1, 2 * len(PROMPTS) + 1)
        for keep in (torch.tensor([0, 2, 3, 5]), torch.tensor([3, 1]), torch.tensor([1])):
            torch.testing.assert_close(lean.step(tokens), ref.step(tokens), atol=1e-5, rtol=1e-5)
            ref.select(keep)
            lean.select(keep)
            tokens = tokens[keep] + 1
            assert lean.cache.size(2) == len(keep)
        torch.testing.assert_close(lean.step(tokens), ref.step(tokens), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mkl", [pytest.param(True, marks=needs_mkl), False])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_a_prefill_after_kept_caches_equals_a_full_prefill(tiny, arch, mkl):
    """KV reuse between turns: rows' caches taken with `rows_cache` after some decode steps,
    then only their new tokens prefilled (`prefill_cached`; one row has no past at all), give
    the logits of a full prefill of the whole sequences, and the same next step. The bound is
    the one of the decoder against the modules above (float32, differently ordered sums)."""
    model, tokenizer = (tiny[0] if arch == "llama" else arch_model(arch, tiny)), tiny[1]
    model.eval()
    pad = tokenizer.pad_token_id
    ids, mask = left_padded(PROMPTS, pad)
    with torch.inference_mode():
        first = LeanLlama(model, ids.size(1) + 4, mkl=mkl)
        first.prefill(ids, mask)
        sampled = [[21, 22, 23], [31, 32, 33], [41, 42, 43]]
        for t in range(3):
            first.step(torch.tensor([row[t] for row in sampled]))
        past = first.rows_cache(torch.tensor([2, 0]))
        assert [kv.size(3) for kv in past] == [len(PROMPTS[2]) + 3, len(PROMPTS[0]) + 3]
        past.append(past[0][:, :, :, :0])  # a row with nothing kept: all its tokens are new
        new = [[51, 52], [61, 62, 63, 64], [71, 72, 73]]
        whole = [PROMPTS[2] + sampled[2] + new[0], PROMPTS[0] + sampled[0] + new[1], new[2]]
        suffix, suffix_mask = left_padded(new, pad)
        cached = LeanLlama(model, 32, mkl=mkl)
        full_ids, full_mask = left_padded(whole, pad)
        full = LeanLlama(model, 32, mkl=mkl)
        torch.testing.assert_close(cached.prefill_cached(past, suffix, suffix_mask),
                                   full.prefill(full_ids, full_mask), atol=1e-5, rtol=1e-5)
        assert cached.positions.tolist() == full.positions.tolist() == [len(w) for w in whole]
        step = torch.tensor([81, 82, 83])
        torch.testing.assert_close(cached.step(step), full.step(step), atol=1e-5, rtol=1e-5)


def test_an_engine_session_reuses_the_kv_cache_of_ended_rows(tiny):
    """In a session, a call whose prompts extend the previous call's rows (prompt + completion
    + new tokens) prefills only what is new, and samples what an engine without reuse samples;
    the kept caches go with the session's end and with new weights. The modules decoder, and
    `reuse_kv=False`, re-prefill."""
    model, tokenizer = tiny
    first = SamplingParams(n=2, max_new_tokens=8, temperature=1.0, stop=("e",))
    turn = SamplingParams(n=1, max_new_tokens=8, temperature=1.0, stop=("e",))
    out = {}
    for path in ("lean_mkl", "lean", "modules") if MKL else ("lean", "modules"):
        for reuse in (True, False):
            engine = HFEngine(model, tokenizer, decoder=path, reuse_kv=reuse)
            with engine.session():
                gen = engine.generate(PROMPTS, first, seeds=[1, 2, 3])
                ended = [i for i, cut in enumerate(gen.truncated) if not cut]
                assert len(ended) >= 3  # the random model writes an "e" within a few tokens
                prompts = [PROMPTS[i // 2] + gen.completion_ids[i] + [90, 91] for i in ended]
                second = engine.generate(prompts, turn, seeds=list(range(len(prompts))))
                kept = path != "modules" and reuse
                cached = sum(len(PROMPTS[i // 2]) + len(gen.completion_ids[i]) - 1 for i in ended)
                assert engine.reused_tokens == (cached if kept else 0)
                assert bool(engine.kept) is kept
                if kept:
                    engine.load_weights(model.named_parameters())  # shared: nothing copied, caches dropped
                    assert engine.kept == {}
            assert engine.kept is None
            out[path, reuse] = (gen.completion_ids, second.completion_ids, second.truncated)
    reference = out["modules", False]
    for key, value in out.items():
        assert value == reference, key


@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_every_decoder_samples_the_same_tokens(tiny, arch, greedy):
    """The three decoders of the HF engine draw the same completions from the same seed, and
    decode the same greedy ones (Qwen3: its query/key norms on the lean path)."""
    model, tokenizer = (tiny[0] if arch == "llama" else tiny_qwen3(tiny[1])), tiny[1]
    out = {}
    for path in ("lean_mkl", "lean", "modules") if MKL else ("lean", "modules"):
        engine = HFEngine(model, tokenizer, decoder=path)
        assert engine.decode_path(6) == (path, None)
        torch.manual_seed(3)
        out[path] = engine.generate(PROMPTS, SamplingParams(n=3, max_new_tokens=10, temperature=1.0,
                                                            greedy=greedy))
        assert engine.last_path == path
    first = next(iter(out.values()))
    for gen in out.values():
        assert gen.completion_ids == first.completion_ids and gen.truncated == first.truncated


@needs_peft
def test_unsupported_models_fall_back_with_a_reason(tiny, monkeypatch):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from reasonrl.model.lora import apply_lora

    model, tokenizer = tiny
    gelu = Qwen3ForCausalLM(Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                        head_dim=16, hidden_act="gelu"))
    assert "hidden_act 'gelu'" in unsupported_reason(gelu)
    wrapped = apply_lora(copy.deepcopy(model), 4, 8, 0.0, ["q_proj", "v_proj"], seed=0)
    assert "LoRA" in unsupported_reason(wrapped)
    path, why = HFEngine(wrapped, tokenizer, decoder="lean").decode_path()
    assert path == "modules" and "LoRA" in why
    engine = HFEngine(wrapped, tokenizer)  # auto: only the modules can run it
    assert engine.generate([[5, 6]], SamplingParams(n=2, max_new_tokens=3)).completion_ids  # still decodes
    assert engine.last_path == "modules"
    monkeypatch.setattr(llama, "mkl_packing", lambda: False)  # a machine without MKL
    assert HFEngine(model, tokenizer, decoder="lean_mkl").decode_path() == (
        "lean", "lean_mkl: this torch has no MKL packed GEMM (not an x86 MKL build)")
    assert HFEngine(model, tokenizer, decoder="modules").decode_path() == ("modules", None)


def test_forward_hooks_send_decoding_through_the_modules(tiny):
    """A hook must run: the lean path would skip it, so a hooked model decodes through the
    modules, checked at each call (the hook may come after the engine)."""
    model, tokenizer = tiny
    model = copy.deepcopy(model)
    engine = HFEngine(model, tokenizer, decoder="lean")
    assert engine.decode_path() == ("lean", None)
    calls = []
    handle = model.lm_head.register_forward_hook(lambda *_: calls.append(1))
    assert engine.decode_path() == ("modules", "lean: forward hooks on lm_head")
    engine.generate([[5, 6]], SamplingParams(n=1, max_new_tokens=3, greedy=True))
    assert calls and engine.last_path == "modules"
    handle.remove()
    assert engine.decode_path() == ("lean", None)


@pytest.mark.parametrize("out_features,block", [(1500, 512), (2048, 256), (300, 512)])
@pytest.mark.parametrize("packing", [True, False])
def test_matrix_layouts_compute_x_at_w_transposed(monkeypatch, out_features, block, packing):
    """Every layout computes x @ W.T + b (+ residual): MKL-packed for a number of rows (fewer
    rows padded; more rows through F.linear), or without MKL the [in, out] copy or, for
    wide outputs, column blocks."""
    if packing and not MKL:
        pytest.skip("this torch has no MKL packed GEMM")
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(out_features, 48, generator=g), torch.randn(out_features, generator=g)
    m = _Matrix(weight, bias, block, mkl=packing)
    assert m.packable is packing
    assert bool(m.block) == (not packing and out_features > 1024)  # wide outputs in column blocks
    m.pack(6)
    for rows in (6, 4, 9):  # packed count, fewer (padded), more (the prefill's path)
        x, residual = torch.randn(rows, 48, generator=g), torch.randn(rows, out_features, generator=g)
        torch.testing.assert_close(m(x), x @ weight.t() + bias, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(m(x, residual), residual + x @ weight.t() + bias, atol=1e-4, rtol=1e-5)


def prefilled(tiny, room: int) -> LeanLlama:
    """A LeanLlama over the tiny model with PROMPTS prefilled and `room` decode steps left."""
    model, tokenizer = tiny
    ids, mask = left_padded(PROMPTS, tokenizer.pad_token_id)
    lean = LeanLlama(model.eval(), ids.size(1) + room)
    lean.prefill(ids, mask)
    return lean


@torch.inference_mode()
def test_decoder_repacks_when_half_the_rows_are_left(tiny):
    lean = prefilled(tiny, 8)
    lean.repeat(4)  # 12 rows
    lean.step(torch.arange(12))
    packed = lean.head.rows
    lean.select(torch.arange(7))
    lean.step(torch.arange(7))
    assert lean.head.rows == packed  # 7 of 12: padded, not repacked
    lean.select(torch.arange(5))
    lean.step(torch.arange(5))
    if lean.head.packable:
        assert packed == 12 and lean.head.rows == 5
    else:
        assert packed == 0 and lean.head.rows == 0


@torch.inference_mode()
def test_decode_length_is_checked(tiny):
    lean = prefilled(tiny, 1)
    lean.step(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="decode length"):
        lean.step(torch.tensor([1, 2, 3]))


# ------------------------------------------------------------------ training kernels


def test_rms_norm_function_matches_transformers_and_gradcheck():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    g = torch.Generator().manual_seed(0)
    norm = LlamaRMSNorm(6, eps=1e-5).double()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(6, generator=g, dtype=torch.float64))
    x = torch.randn(3, 4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(RMSNormFunction.apply(x, norm.weight, 1e-5), norm(x))
    assert torch.autograd.gradcheck(lambda a, w: RMSNormFunction.apply(a, w, 1e-5), (x, norm.weight))


def test_rms_norm_backward_hand_computed():
    """x = [3, 4], w = [1, 2], eps = 0: r = 1/sqrt(12.5), n = r x, y = w n; L = sum(y).
    dL/dw = n = [0.8485, 1.1314]; dn = w = [1, 2],
    mean(dn n) = (0.8485 + 2.2627) / 2 = 1.5556, dx = r (dn - n 1.5556) = r [-0.32, 0.24]
    = [-0.0905, 0.0679]."""
    x = torch.tensor([[3.0, 4.0]], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    RMSNormFunction.apply(x, w, 0.0).sum().backward()
    torch.testing.assert_close(w.grad, torch.tensor([0.848528, 1.131371], dtype=torch.float64),
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(x.grad, torch.tensor([[-0.090510, 0.067882]], dtype=torch.float64),
                               atol=1e-6, rtol=0)


def test_swiglu_functions_gradcheck_and_values():
    g = torch.Generator().manual_seed(1)
    gate = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    up = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(SwiGLUFunction.apply(gate, up), nn.functional.silu(gate) * up)
    torch.testing.assert_close(SwiGLUDownFunction.apply(gate, up, w, b),
                               nn.functional.linear(nn.functional.silu(gate) * up, w, b))
    assert torch.autograd.gradcheck(SwiGLUFunction.apply, (gate, up))
    assert torch.autograd.gradcheck(SwiGLUDownFunction.apply, (gate, up, w, b))
    assert torch.autograd.gradcheck(SwiGLUDownFunction.apply, (gate, up, w, None))
    # silu'(0) = 1/2: d/dgate of silu(gate) * up at gate = 0, up = 3 is 1.5
    zero = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    SwiGLUFunction.apply(zero, torch.tensor([3.0], dtype=torch.float64)).sum().backward()
    assert zero.grad.item() == pytest.approx(1.5)


def loss_and_grads(model, share_prompt: bool):
    model.zero_grad(set_to_none=True)
    prompt_ids, completion_ids = grouped_rows()
    total = 0.0
    for mb in make_micro_batches(prompt_ids, completion_ids, 4, 0, share_prompt=share_prompt):
        logp, _ = completion_logprobs(model, mb)
        loss = (logp * mb.mask).sum()
        loss.backward()
        total += loss.item()
    return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_repeated_key_value_heads_serve_each_query_head_its_own_group(monkeypatch):
    """4 query heads over 2 key/value heads: heads 0-1 read kv head 0, heads 2-3 kv head 1,
    whether SDPA groups them (native GQA) or the kv heads are repeated (`expand_kv_heads`, a
    GPU's path with a mask or float32); with a padding mask, values and gradients."""
    from reasonrl.accel import kernels

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 8, generator=gen, requires_grad=True)
    k, v = (torch.randn(2, 2, 5, 8, generator=gen, requires_grad=True) for _ in range(2))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    mask[1, :, :, 0] = False  # row 1's first position is padding
    mask[1, :, 0, 0] = True   # (it still sees itself: no empty softmax)
    out = {}
    for expand in (False, True):
        monkeypatch.setattr(kernels, "expand_kv_heads", lambda query, m, e=expand: e)
        o, _ = kernels.gqa_sdpa_attention(None, q, k, v, mask, is_causal=False)
        out[expand] = (o, *torch.autograd.grad(o.square().sum(), (q, k, v)))
    for a, b in zip(out[False], out[True], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    # and head 3 reads kv head 1: the repeat is per group (repeat_interleave), not tiled
    direct = torch.softmax((q[:, 3] @ k[:, 1].transpose(-1, -2)) / 8**0.5
                           + torch.zeros(2, 5, 5).masked_fill(~mask[:, 0], float("-inf")), -1) @ v[:, 1]
    torch.testing.assert_close(out[True][0][:, :, 3], direct, atol=1e-6, rtol=1e-5)


def test_bf16_training_attention_takes_the_math_kernel_with_the_fused_kernels_values(monkeypatch):
    """bf16 with gradients on a CPU runs SDPA's math kernel (`math_attention`); fp32, no-grad
    forwards and more keys than the cap keep the fused kernel. Both kernels give the same
    values and gradients to bf16 rounding: each output is a softmax-weighted mean of 8-element
    dot products, each operand rounded once (u = 2^-8), so 4 u relative to the largest entry
    holds for either side (measured ~1 u)."""
    from reasonrl.accel import kernels

    gen = torch.Generator().manual_seed(0)
    q32 = torch.randn(2, 4, 6, 8, generator=gen)
    k32, v32 = (torch.randn(2, 2, 6, 8, generator=gen) for _ in range(2))
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    q, k, v = (t.bfloat16().requires_grad_(True) for t in (q32, k32, v32))
    assert kernels.math_attention(q, k) and not kernels.math_attention(q32, k32)
    with torch.no_grad():
        assert not kernels.math_attention(q, k)
    monkeypatch.setattr(kernels, "MATH_ATTENTION_MAX_KEYS", 5)
    assert not kernels.math_attention(q, k)  # 6 keys: over the cap
    out = {}
    for cap in (5, 1024):  # the fused kernel, then the math kernel
        monkeypatch.setattr(kernels, "MATH_ATTENTION_MAX_KEYS", cap)
        o, _ = kernels.gqa_sdpa_attention(None, q, k, v, mask, is_causal=False)
        out[cap] = (o, *torch.autograd.grad(o.float().square().sum(), (q, k, v)))
    for a, b in zip(out[5], out[1024], strict=True):
        assert a.dtype == torch.bfloat16
        assert (a.float() - b.float()).abs().max() <= 4 * 2.0 ** -8 * a.float().abs().max()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("share_prompt", [False, True])
@pytest.mark.parametrize("expand", [False, True], ids=["native_gqa", "repeated_kv"])
def test_lean_kernels_same_loss_and_gradient(tiny, arch, share_prompt, expand, monkeypatch):
    """Both attention layouts: native GQA (a CPU's), and the key/value heads repeated (what a
    GPU runs where a mask or float32 rule out the GQA kernels: `expand_kv_heads`)."""
    from reasonrl.accel import kernels

    monkeypatch.setattr(kernels, "expand_kv_heads", lambda query, mask: expand)
    base = arch_model(arch, tiny)
    base.train()
    lean = copy.deepcopy(base)
    norms = 9 if arch == "qwen3" else 5  # Qwen3: each layer's query and key norms too
    assert apply_lean_kernels(lean) == [f"rmsnorm x{norms}", "swiglu x2", "sdpa-gqa"]
    expected_loss, expected = loss_and_grads(base, share_prompt)
    loss, grads = loss_and_grads(lean, share_prompt)
    assert loss == pytest.approx(expected_loss, rel=1e-6)
    assert grads.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(grads[name], expected[name], atol=1e-6, rtol=1e-4, msg=name)


@needs_peft
def test_lean_kernels_with_lora_same_gradient(tiny):
    from reasonrl.model.lora import apply_lora

    model, _ = tiny
    base = apply_lora(copy.deepcopy(model), 4, 8, 0.0, ["q_proj", "down_proj"], seed=0)
    with torch.no_grad():  # B = 0 at init: make the adapters matter
        for name, p in base.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    lean = copy.deepcopy(base)
    assert "swiglu x2" in apply_lean_kernels(lean)  # down_proj is wrapped: its own module runs
    expected_loss, expected = loss_and_grads(base, True)
    loss, grads = loss_and_grads(lean, True)
    assert loss == pytest.approx(expected_loss, rel=1e-6)
    for name in expected:
        torch.testing.assert_close(grads[name], expected[name], atol=1e-6, rtol=1e-4, msg=name)


def saved_bytes(model, monkeypatch) -> int:
    """Bytes of activations autograd keeps for one micro-batch (parameters excluded): what
    the training forward's saved-tensor hook (`recompute_norm_outputs`) keeps as tensors."""
    from reasonrl.accel import kernels

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    pack = kernels._pack

    def counting_pack(t):
        kept = pack(t)
        if isinstance(kept, torch.Tensor) and kept.untyped_storage().data_ptr() not in params:
            seen[kept.untyped_storage().data_ptr()] = kept.untyped_storage().nbytes()
        return kept

    monkeypatch.setattr(kernels, "_pack", counting_pack)
    prompt_ids, completion_ids = grouped_rows()
    mb = make_micro_batches(prompt_ids, completion_ids, 6, 0, share_prompt=True)[0]
    completion_logprobs(model, mb)
    return sum(seen.values())


def test_lean_kernels_keep_fewer_activations(tiny, monkeypatch):
    model, _ = tiny
    base = copy.deepcopy(model).train()
    lean = copy.deepcopy(base)
    apply_lean_kernels(lean)
    assert saved_bytes(lean, monkeypatch) < 0.7 * saved_bytes(base, monkeypatch)


def test_other_families_are_left_alone():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2))
    assert apply_lean_kernels(model) == []


def test_saved_model_keeps_the_standard_attention(tiny, tmp_path):
    import json

    model, _ = tiny
    lean = copy.deepcopy(model)
    apply_lean_kernels(lean)
    lean.save_pretrained(tmp_path)
    assert "reasonrl" not in json.dumps(json.loads((tmp_path / "config.json").read_text()))


def test_config_switches_reach_the_engine_and_the_worker(tiny):
    """`rollout.hf_decoder`, `rollout.hf_reuse_kv` and `optim.lean_kernels`, as the docs describe them."""
    from reasonrl.config import RolloutConfig, load_config
    from reasonrl.rollout import make_engine
    from reasonrl.workers.policy import PolicySettings, PolicyWorker

    model, tokenizer = tiny
    for path in ("lean", "modules"):
        engine = make_engine("hf", model, tokenizer, RolloutConfig(hf_decoder=path))
        assert engine.decode_path() == (path, None)
    for reuse in (True, False):  # rollout.hf_reuse_kv
        assert make_engine("hf", model, tokenizer, RolloutConfig(hf_reuse_kv=reuse)).reuse_kv is reuse
    for value, expected in (("true", ["rmsnorm x5", "swiglu x2", "sdpa-gqa"]), ("false", [])):
        cfg = load_config(None, ["model.path=tiny", f"optim.lean_kernels={value}"])
        worker = PolicyWorker(copy.deepcopy(model), 0, PolicySettings.from_config(cfg))
        assert worker.learner.accel.kernels == expected


def test_free_memory_is_released_before_each_updates_first_backward(tiny, monkeypatch):
    from helpers import policy_settings

    from reasonrl.accel import memory
    from reasonrl.batch import TrainBatch
    from reasonrl.workers.policy import PolicyWorker

    assert memory.release_free_memory() is True  # glibc: malloc_trim is there
    calls = []
    monkeypatch.setattr(memory, "release_free_memory", lambda: calls.append(1))
    model, _ = tiny
    worker = PolicyWorker(copy.deepcopy(model), 0, policy_settings(micro_batch_size=2))
    prompt_ids, completion_ids = grouped_rows()  # 6 rows: 3 micro-batches of 2, one update
    worker.train_step(TrainBatch(prompt_ids, completion_ids, torch.randn(6)))
    assert len(calls) == 1
    worker.learner.mini_batches = 2  # two updates: one release each
    worker.train_step(TrainBatch(prompt_ids, completion_ids, torch.randn(6)))
    assert len(calls) == 3


def test_without_glibc_memory_release_is_a_no_op(monkeypatch):
    """macOS and musl have no malloc_trim: the call says so and changes nothing."""
    from reasonrl.accel import memory

    monkeypatch.setattr(memory, "_libc", lambda: None)
    assert memory.release_free_memory() is False


def test_fsdp_shards_and_mixed_dtypes_keep_torch_s_own_tensors(tiny):
    """The flat buffers only for plain parameters of one dtype: otherwise the plain path."""
    from reasonrl.accel import TrainingAccel

    model = copy.deepcopy(tiny[0])
    model.lm_head.weight.data = model.lm_head.weight.data.clone()  # untie, then make it bf16
    model.model.embed_tokens.to(torch.bfloat16)
    accel_ = TrainingAccel(model, kernels=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    accel_.attach(optimizer)
    assert not accel_.flat and accel_.gradients() is None and accel_.kernels == []


# ------------------------------------------------------------------ Qwen3 folders and LoRA runs


def lean_run(tmp_path, *overrides: str):
    """A 1-step run of configs/smoke.yaml; the engine's decoder of its last call."""
    from reasonrl.config import load_config
    from reasonrl.train.trainer import Trainer

    threads = torch.get_num_threads()
    cfg = load_config(REPO / "configs" / "smoke.yaml", [
        "trainer.steps=1", "trainer.progress=false", "tracking.report=false", "trainer.threads=1",
        f"trainer.output_dir={tmp_path}", "trainer.run_name=run", "rollout.hf_decoder=lean", *overrides])
    trainer = Trainer(cfg)
    try:
        trainer.fit()
        return trainer.workers.rollout.engine.last_path, trainer.workers.rollout.engine.decode_path(8)
    finally:
        trainer.workers.close()
        torch.set_num_threads(threads)


def test_a_qwen3_folder_trains_and_decodes_on_the_lean_path(tiny, tmp_path):
    """`model.path=<a Qwen3 folder>`: the run trains, and its engine decodes on the lean path
    (query/key norms included), not through the modules."""
    folder = tmp_path / "qwen3"
    tiny_qwen3(tiny[1]).save_pretrained(folder)
    tiny[1].save_pretrained(folder)
    assert lean_run(tmp_path, f"model.path={folder}") == ("lean", ("lean", None))


@needs_peft
def test_a_lora_run_decodes_on_the_lean_path(tmp_path):
    """A LoRA run's engine decodes a plain copy of the model, refreshed with the merged weights
    at each sync (placement), so the lean decoder runs it: no wrapped projections reach it."""
    assert lean_run(tmp_path, "model.path=tiny", "model.lora.rank=4") == ("lean", ("lean", None))
