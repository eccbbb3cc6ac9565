"""Gradient checkpointing (`optim.gradient_checkpointing`): each decoder layer keeps only its
input for the backward and recomputes everything inside it when the backward reaches it
(Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"; torch's non-reentrant
`torch.utils.checkpoint`). The gradient is the same; activation memory falls from all the
layers' intermediates to one layer's plus each layer's input, for one more forward per layer.

It wraps the layers' own `forward` (an instance attribute, as the lean kernels do for norms
and MLPs), so it composes with `optim.lean_kernels` and LoRA adapters: the recompute runs the
same modules, kernels included. It applies only where a layer runs with gradients and without
a KV cache: a recomputed layer would write its keys and values into the cache a second time, so
the policy worker uses the plain micro-batch layout (no shared-prompt cache) when it is on.
Forwards without gradients (rollouts, reference and old log-probs, entropy) run as before and
keep nothing, so on the reference model (which never runs with gradients) it changes nothing.
"""

from __future__ import annotations

import types

import torch
from torch.utils.checkpoint import checkpoint

from reasonrl.accel.kernels import transformers_model


def _checkpointed_forward(self, *args, **kwargs):
    forward = type(self).forward.__get__(self)  # the class's forward: a deepcopy rebinds to its copy
    if not torch.is_grad_enabled() or kwargs.get("past_key_values") is not None:
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def _layers(model):
    """The decoder layers of the transformers model in `model` (itself, or inside a LoRA
    wrapper, a data-parallel rank's root, the critic's value model)."""
    return getattr(transformers_model(model).get_decoder(), "layers", None)


def checkpoint_layers(model) -> int:
    """Make every decoder layer of `model` (Llama-family, Qwen, Mistral, ..., bare or inside
    their LoRA, FSDP or value-model wrappers) recompute its activations in the backward.
    Idempotent; returns the number of layers. ValueError for a model without such layers."""
    layers = _layers(model)
    if not layers:
        raise ValueError(f"optim.gradient_checkpointing: {type(model).__name__} has no decoder layers "
                         "(model.get_decoder().layers) to checkpoint")
    for layer in layers:
        if getattr(vars(layer).get("forward"), "__func__", None) is not _checkpointed_forward:
            layer.forward = types.MethodType(_checkpointed_forward, layer)
    return len(layers)


def is_checkpointed(model) -> bool:
    """True when every decoder layer of `model` recomputes its activations in the backward."""
    layers = _layers(model) or []
    return bool(layers) and all(getattr(vars(layer).get("forward"), "__func__", None) is _checkpointed_forward
                                for layer in layers)
