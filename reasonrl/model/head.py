"""Token log-probs and entropies through the LM head, chunked: the [tokens, vocab] logits
never exist whole, in the forward or the backward.

For a 135M model with a 49k vocabulary, one micro-batch of 8 x 128 completion tokens has
201 MB of fp32 logits; the plain path (`head(h)`, `log_softmax`, `gather`) keeps the
log-softmax output for the backward and makes several more such tensors around it (the
entropy, the gradients). Here the forward keeps only the hidden states it was given
(autograd holds them anyway) and one log-sum-exp per token, and the backward recomputes
each chunk's logits. Cost: one more LM-head matrix product per token in the backward.

The approach is the fused linear cross-entropy of Liger Kernel (Hsu et al. 2024,
arXiv:2410.10989) and Cut Cross-Entropy (Wijmans et al. 2024, arXiv:2411.09009), with the
entropy term added. With z = logits / temperature, p = softmax(z), lse = logsumexp(z),
target t:

    log p_t = z_t - lse                   d log p_t / dz = onehot(t) - p
    H = lse - sum_j p_j z_j                dH / dz_j = -p_j (log p_j + H)

and d/dlogits = (1 / temperature) d/dz.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 23  # logits per chunk: 8M floats (32 MB fp32), ~170 tokens at 49k vocab


def chunk_rows(vocab: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(vocab, 1))


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, inv_temperature: float, with_entropy: bool,
                entropy_grad: bool):
        n = hidden.size(0)
        logp = hidden.new_empty(n, dtype=torch.float32)
        lse = hidden.new_empty(n, dtype=torch.float32)
        entropy = hidden.new_zeros(n, dtype=torch.float32)
        step = chunk_rows(weight.size(0))
        for s in range(0, n, step):
            z = (hidden[s: s + step] @ weight.t()).float()
            if inv_temperature != 1.0:
                z.mul_(inv_temperature)
            lse_c = torch.logsumexp(z, dim=-1)
            lse[s: s + step] = lse_c
            logp[s: s + step] = z.gather(-1, targets[s: s + step, None]).squeeze(-1) - lse_c
            if with_entropy:
                entropy[s: s + step] = lse_c - (torch.softmax(z, dim=-1) * z).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.inv_temperature, ctx.entropy_grad = inv_temperature, with_entropy and entropy_grad
        if not ctx.entropy_grad:
            ctx.mark_non_differentiable(entropy)
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no work for it
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = None  # the first chunk's product starts it (no zero-filled [vocab, H] first)
        use_entropy = ctx.entropy_grad and grad_entropy is not None
        if grad_logp is None:
            grad_logp = torch.zeros_like(lse)
        step = chunk_rows(weight.size(0))
        for s in range(0, hidden.size(0), step):
            h = hidden[s: s + step]
            z = (h @ weight.t()).float()
            if ctx.inv_temperature != 1.0:
                z.mul_(ctx.inv_temperature)
            log_p = z.sub_(lse[s: s + step, None])  # z is not needed past this point
            p = log_p.exp()
            g_logp = grad_logp[s: s + step, None].float()
            g = p * -g_logp
            g.scatter_add_(-1, targets[s: s + step, None], g_logp)
            if use_entropy:
                g_ent = grad_entropy[s: s + step, None].float()
                g.sub_(p.mul_(log_p.add_(entropy[s: s + step, None])).mul_(g_ent))
            if ctx.inv_temperature != 1.0:
                g.mul_(ctx.inv_temperature)
            g = g.to(hidden.dtype)
            if need_hidden:
                grad_hidden[s: s + step] = g @ weight
            if need_weight:
                grad_weight = g.t() @ h if grad_weight is None else grad_weight.addmm_(g.t(), h)
        return grad_hidden, grad_weight, None, None, None, None


def fusable(head) -> bool:
    """The chunked path needs a plain bias-free linear head (HF causal LMs' `lm_head`)."""
    return type(head) is torch.nn.Linear and head.bias is None


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                  temperature: float = 1.0, with_entropy: bool = False,
                  entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), entropy) per position of `hidden` [..., H] under softmax(hidden W^T /
    temperature), shaped like `targets` [...]. The entropy is zeros unless `with_entropy`,
    and differentiable only with `entropy_grad`. Equal to the plain path to float rounding."""
    shape = targets.shape
    logp, entropy = _HeadLogprobs.apply(hidden.reshape(-1, hidden.size(-1)), weight,
                                        targets.reshape(-1), 1.0 / temperature, with_entropy,
                                        entropy_grad)
    return logp.view(shape), entropy.view(shape)
