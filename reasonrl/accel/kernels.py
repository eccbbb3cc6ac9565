"""Memory-lean training kernels for Llama-family decoders (`optim.lean_kernels`, on by default).

The same values and gradients as the transformers modules they replace (tests/accel/test_accel.py
checks both against them), with fewer activations kept for the backward. On SmolLM2-135M a
token costs about 1.5 MB of saved activations through the transformers modules; these three
cut that by ~40 % (docs/performance.md):

- RMSNorm (`RMSNormFunction`): keeps the input and 1/rms, not also the normalised input;
  the backward recomputes it (one multiply). Under `recompute_norm_outputs` (the worker's
  training forward) the norm's output, which the next projections keep as their input, is
  recomputed in the backward as well.
- SwiGLU MLP (`SwiGLUDownFunction`, `SwiGLUFunction`): down(silu(gate) * up) keeps gate
  and up only; silu(gate), the product and (with a plain `nn.Linear` down projection) the
  down projection's input are recomputed in the backward. Shazeer 2020, "GLU Variants
  Improve Transformer".
- Attention: `torch.nn.functional.scaled_dot_product_attention` with native grouped-query
  attention (`enable_gqa`). transformers repeats every key/value head to the query heads
  whenever there is a mask (`repeat_kv`), so the saved keys and values are 3x larger for
  SmolLM2's 9 query / 3 key-value heads; torch's CPU flash kernel and CUDA kernels take
  the grouped heads directly.

`apply_lean_kernels(model)` swaps these into a loaded model (the module objects and their
parameters stay; LoRA-wrapped projections keep working, the down projection then runs as
its own module). Models of other families are left as they are.
"""

from __future__ import annotations

import contextlib
import types
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
ATTENTION = "reasonrl_sdpa"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(w * (x / sqrt(mean(x^2) + eps)), 1 / sqrt(mean(x^2) + eps)), computed in fp32 (float64
    stays float64) and cast back before the weight, as transformers' LlamaRMSNorm does. The
    one RMSNorm forward of the project: the training kernel and the lean decoder use it."""
    h = x.to(torch.promote_types(x.dtype, torch.float32))
    rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (h * rstd).to(x.dtype), rstd


class RMSNormFunction(torch.autograd.Function):
    """y = w * (x / sqrt(mean(x^2) + eps)), computed in fp32 and cast back before the weight
    (transformers' LlamaRMSNorm; Zhang & Sennrich 2019, "Root Mean Square Layer
    Normalization"); float64 stays float64. Backward, with n = x * r and r = 1/sqrt(mean(x^2) + eps):
    dx = r * (dn - n * mean(dn * n)) with dn = dy * w, and dw = sum over tokens of dy * n."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out, rstd = rms_norm(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        if _norm_outputs is not None:  # the projections after the norm may keep a recipe for it
            _norm_outputs[out.data_ptr()] = (weakref.ref(out), x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        n = x.to(rstd.dtype) * rstd
        grad_x = grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = (grad * n.to(x.dtype)).reshape(-1, weight.numel()).sum(0).to(weight.dtype)
        if ctx.needs_input_grad[0]:
            dn = (grad * weight).to(rstd.dtype)
            dot = (dn * n).mean(-1, keepdim=True)
            grad_x = dn.sub_(n.mul_(dot)).mul_(rstd).to(x.dtype)  # in place: n and dn are done with
        return grad_x, grad_w, None


_norm_outputs: dict | None = None  # RMSNorm outputs of the forward in `recompute_norm_outputs`


class _NormRecipe:
    """What an RMSNorm output is made of (its input, weight and 1/rms, all kept anyway)."""

    def __init__(self, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor):
        self.x, self.weight, self.rstd = x, weight, rstd

    def compute(self) -> torch.Tensor:  # the forward's arithmetic: bitwise the same tensor
        return self.weight * (self.x.to(self.rstd.dtype) * self.rstd).to(self.x.dtype)


def _pack(t: torch.Tensor):
    entry = _norm_outputs.get(t.data_ptr()) if _norm_outputs is not None else None
    if entry is not None and entry[0]() is t:
        return _NormRecipe(*entry[1:])
    return t


def _unpack(saved):
    return saved.compute() if isinstance(saved, _NormRecipe) else saved


@contextlib.contextmanager
def recompute_norm_outputs() -> Iterator[None]:
    """Within the block, a lean RMSNorm's output that a later operation keeps for its
    backward (the q/k/v and gate/up projections keep their input) is kept as a recipe and
    recomputed when the backward needs it: two [tokens, hidden] tensors per layer fewer.
    No effect on models without the lean kernels."""
    global _norm_outputs
    outer, _norm_outputs = _norm_outputs, {}
    try:
        with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
            yield
    finally:
        _norm_outputs = outer


def _swiglu_grads(grad_h: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, silu: torch.Tensor):
    """d/d(gate) and d/d(up) of h = silu(gate) * up, given silu(gate): torch's `silu_backward`
    (silu'(g) = s (1 + g (1 - s)), s = sigmoid(g)) in one kernel."""
    return torch.ops.aten.silu_backward(grad_h * up, gate), grad_h * silu


class SwiGLUFunction(torch.autograd.Function):
    """h = silu(gate) * up, keeping gate and up (not also silu(gate))."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        return _swiglu_grads(grad, gate, up, F.silu(gate))


class SwiGLUDownFunction(torch.autograd.Function):
    """down(silu(gate) * up) = (silu(gate) * up) @ W.T + b, keeping gate, up and W: the
    product (the down projection's input) is recomputed in the backward."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(gate, up, weight)
        ctx.has_bias = bias is not None
        return F.linear(F.silu(gate) * up, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up, weight = ctx.saved_tensors
        grad_h = grad @ weight
        silu = F.silu(gate)
        grad_gate, grad_up = _swiglu_grads(grad_h, gate, up, silu)
        grad_w = grad_b = None
        flat = grad.reshape(-1, grad.size(-1))
        if ctx.needs_input_grad[2]:
            h = silu.mul_(up).reshape(-1, gate.size(-1))  # the forward's product, recomputed
            grad_w = flat.t() @ h
        if ctx.has_bias and ctx.needs_input_grad[3]:
            grad_b = flat.sum(0)
        return grad_gate, grad_up, grad_w, grad_b


def _rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return RMSNormFunction.apply(hidden_states, self.weight, self.variance_epsilon)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    gate, up = self.gate_proj(x), self.up_proj(x)
    if type(self.down_proj) is nn.Linear:
        return SwiGLUDownFunction.apply(gate, up, self.down_proj.weight, self.down_proj.bias)
    return self.down_proj(SwiGLUFunction.apply(gate, up))


_additive_cache: tuple = (None, None)  # (weakref to the last bool mask, its additive form)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The bool mask as SDPA would convert it (0 where True, -inf where False), made once per
    forward and shared by every layer: SDPA converts a bool mask on each call and keeps each
    layer's copy for the backward."""
    global _additive_cache
    ref, additive = _additive_cache
    if ref is None or ref() is not mask or additive.dtype != dtype:
        additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
        _additive_cache = (weakref.ref(mask), additive)
    return additive


def expand_kv_heads(query: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
    """Whether to repeat the key/value heads (transformers' `repeat_kv`) instead of native GQA.
    On CUDA only flash attention and the math kernel take grouped-query heads; flash takes
    neither a mask nor float32, and the math kernel keeps the [heads, L, L] probabilities for
    the backward (an H100, SmolLM2-135M fp32, 16 rows of up to 1,174 positions: 35.7 GiB peak).
    The memory-efficient kernel takes masks and float32 but needs as many key/value heads as
    query heads: there they are repeated. On a CPU native GQA runs in the fused kernel."""
    return query.is_cuda and (attention_mask is not None or query.dtype == torch.float32)


MATH_ATTENTION_MAX_KEYS = 1024  # bf16 training on a CPU: the math kernel up to this many keys


def math_attention(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether a training forward runs attention through SDPA's math kernel instead of the
    fused (flash) CPU kernel: bf16 on a CPU, with gradients, up to `MATH_ATTENTION_MAX_KEYS`.

    The fused CPU kernel's backward gains nothing from bf16, while the math kernel's batched
    matrix products run on the CPU's bf16 units (AMX). Measured on a 2-core Sapphire Rapids
    (SmolLM2-135M, 16 rows of 100 positions, forward and backward, the lean kernels): bf16 with
    the fused kernel 5.1-6.2 s, of which its backward 1.8 s; bf16 with the math kernel 2.9-4.2 s;
    fp32 5.8-6.7 s with either (so fp32 keeps the fused kernel). The math kernel keeps the
    [rows, heads, L, L] probabilities for the backward: 2 B x heads x L per position, 18 KB per
    layer at 1,024 keys and 9 heads, hence the cap."""
    return (query.device.type == "cpu" and query.dtype == torch.bfloat16 and torch.is_grad_enabled()
            and key.shape[2] <= MATH_ATTENTION_MAX_KEYS)


def gqa_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                       scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers' `sdpa_attention_forward` (same mask and causal rules) with native
    grouped-query attention instead of `repeat_kv` (and, for bf16 training on a CPU, the math
    kernel: `math_attention`)."""
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = query.shape[2] > 1 and attention_mask is None and is_causal
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attention_mask = _additive(attention_mask, query.dtype)
    groups = query.shape[1] // key.shape[1]
    if groups > 1 and expand_kv_heads(query, attention_mask):
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    with sdpa_kernel(SDPBackend.MATH) if math_attention(query, key) else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                             scale=scaling, is_causal=is_causal,
                                             enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION, gqa_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


def transformers_model(model):
    """The transformers model inside `model` (a peft wrapper, an FSDP root) or `model`."""
    from transformers import PreTrainedModel

    return next((m for m in model.modules() if isinstance(m, PreTrainedModel)), model)


def apply_lean_kernels(model) -> list[str]:
    """Swap the lean kernels into `model` in place; returns what was swapped (empty for
    model families other than `FAMILIES`, which stay as transformers builds them)."""
    base = transformers_model(model)
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in FAMILIES:
        return []
    done = []
    norms = [m for m in base.modules() if type(m).__name__.endswith("RMSNorm")
             and hasattr(m, "variance_epsilon") and isinstance(getattr(m, "weight", None), torch.Tensor)]
    for m in norms:
        m.forward = types.MethodType(_rms_norm_forward, m)
    if norms:
        done.append(f"rmsnorm x{len(norms)}")
    silu = getattr(config, "hidden_act", None) in ("silu", "swish")
    mlps = [m for m in base.modules()
            if silu and all(hasattr(m, p) for p in ("gate_proj", "up_proj", "down_proj"))]
    for m in mlps:
        m.forward = types.MethodType(_mlp_forward, m)
    if mlps:
        done.append(f"swiglu x{len(mlps)}")
    if getattr(config, "_attn_implementation", None) in ("sdpa", ATTENTION):
        _register_attention()
        base.set_attn_implementation(ATTENTION)
        done.append("sdpa-gqa")
    return done
