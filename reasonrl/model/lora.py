"""LoRA adapters through `peft`: building them, the reference policy without a second copy,
the merged weights the rollout engine serves, saving and loading the adapter.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models",
arXiv:2106.09685, eq. 3) trains W' = W + (alpha / r) B A with W frozen, A [r, in] random
and B [out, r] zero at the start, so the adapted model starts as the base model. Only A and
B get gradients and AdamW state: a few MiB instead of four copies of the model.

`peft` is an optional extra: `pip install 'reasonrl[lora]'`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

ADAPTER = "default"  # peft's name for the one adapter


def require_peft():
    try:
        import peft
    except ImportError as err:
        raise ImportError("model.lora.rank > 0 needs peft: pip install 'reasonrl[lora]'") from err
    return peft


def apply_lora(model, rank: int, alpha: float, dropout: float, target_modules: list[str], seed: int = 0):
    """`model` wrapped by a peft LoRA adapter. A is drawn from a generator seeded with `seed`
    (the adapter is the same in every process that builds it); the base weights are frozen."""
    peft = require_peft()
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,
                             target_modules=list(target_modules), task_type="CAUSAL_LM")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        try:
            return peft.get_peft_model(model, config)
        except ValueError as err:  # e.g. "Target modules {...} not found in the base model"
            raise ValueError(f"model.lora.target_modules={list(target_modules)}: {err}") from err


def is_lora(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


class AdapterDisabled:
    """The base model under a LoRA adapter, run with the adapter switched off: the reference
    policy (pi_ref = the model before training) at no extra memory. It offers the two calls
    `completion_logprobs` makes (`get_decoder()(...)`, `get_output_embeddings()(...)`).
    `adapters` is the peft model whose adapter is switched off when `model` is a wrapper
    around it (a data-parallel rank's sharded root); by default `model` itself."""

    def __init__(self, model, adapters=None):
        self.model = model
        self.adapters = model if adapters is None else adapters
        self.config = model.config  # the KV cache of shared-prompt micro-batches reads it

    def _disabled(self, module):
        def run(*args, **kwargs):
            with self.adapters.disable_adapter():
                return module(*args, **kwargs)
        return run

    def get_decoder(self):
        return self._disabled(self.model.get_decoder())

    def get_output_embeddings(self):
        return self._disabled(self.model.get_output_embeddings())


def reference_model(model):
    """The frozen reference policy: the adapter switched off for a LoRA model, else a copy."""
    import copy

    if is_lora(model):
        return AdapterDisabled(model)
    return copy.deepcopy(model).eval().requires_grad_(False)


def adapted_layers(model) -> dict[str, torch.nn.Module]:
    """The LoRA layers of the peft model `model` by the name of the base weight they adapt
    (`...q_proj.base_layer.weight`, relative to `model.get_base_model()`)."""
    peft = require_peft()
    return {f"{name}.base_layer.weight": module for name, module in model.get_base_model().named_modules()
            if isinstance(module, peft.tuners.lora.LoraLayer) and ADAPTER in module.lora_A}


def served_name(base_name: str) -> str:
    """A base-model parameter's name in the plain HF model (`.base_layer.` dropped)."""
    return base_name.replace(".base_layer.", ".")


def merged_named_weights(model, names: set[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapted model's weights as a plain HF model has them: W + (alpha / r) B A for each
    adapted layer (peft's `get_delta_weight`), every other base weight as it is, under the
    base model's names (no `base_model.model.` prefix, no `.base_layer`); only `names` when
    given. Nothing in `model` changes (merging in place and back would leave round-off in W)."""
    base = model.get_base_model()
    adapted = adapted_layers(model)
    for name, param in base.named_parameters():
        if ".lora_" in name or names is not None and served_name(name) not in names:
            continue
        if name in adapted:  # one merged copy at a time: the consumer copies it and drops it
            with torch.no_grad():
                param = param + adapted[name].get_delta_weight(ADAPTER).to(param.dtype)
        yield served_name(name), param.detach()


def save_merged(model, path: Path, tokenizer=None) -> None:
    """An HF folder with the merged weights, loadable by transformers and vLLM like any model."""
    base = model.get_base_model()
    base.save_pretrained(path, state_dict=dict(merged_named_weights(model)))
    if tokenizer is not None:
        tokenizer.save_pretrained(path)


def save_adapter(model, path: Path) -> None:
    """peft's adapter folder (adapter_config.json + adapter_model.safetensors): what a resume
    loads, and what `peft.PeftModel.from_pretrained(base, path)` reads."""
    model.save_pretrained(path)


def load_adapter(model, tensors: dict[str, torch.Tensor]) -> None:
    """Copy a saved adapter (as `save_adapter` wrote it) into `model`; a tensor that matches
    nothing, or a LoRA weight left unset, is an error."""
    peft = require_peft()
    result = peft.set_peft_model_state_dict(model, tensors, adapter_name=ADAPTER)
    lora_names = {n for n, _ in model.named_parameters() if ".lora_" in n}
    missing = sorted(set(result.missing_keys) & lora_names)
    if result.unexpected_keys or missing:
        raise KeyError(f"adapter weights do not match the model: missing {missing[:5]}, "
                       f"unexpected {sorted(result.unexpected_keys)[:5]}")
