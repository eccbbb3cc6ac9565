"""The run's model as the trainable workers get it: loaded once per process and shared by the
workers built there (`base_model`).

A worker's `from_config(cfg, host)` asks for its model here. `host.shared` is the dict the
workers built in one process share (placement gives one per process, None for a worker in a
process of its own): in local placement the policy, its HF rollout engine and the critic start
from one load of `model.path`, the critic from a copy taken before LoRA wraps the policy's model
in place, and with LoRA the rollout engine from a plain copy too (it receives merged weights);
otherwise the engine shares the policy's model and a weight sync copies nothing. In a process of
its own (a Ray actor, the rollout process of asynchronous training) each loads its own.
"""

from __future__ import annotations

import copy

from reasonrl.config import Config
from reasonrl.errors import ConfigError
from reasonrl.model.load import load_model_and_tokenizer
from reasonrl.model.precision import load_dtype
from reasonrl.registry import needs_critic


def load_model(cfg: Config, device: str = "cpu"):
    """(model, tokenizer) of `model.path` on `device`, in the dtype `model.precision` loads in
    (`reasonrl.model.precision.load_dtype`: fp32 unless pure bf16)."""
    model, tokenizer = load_model_and_tokenizer(cfg.model.path, load_dtype(cfg.model.precision),
                                                seed=cfg.trainer.seed, revision=cfg.model.revision)
    return model.to(device), tokenizer


def critic_lm(cfg: Config, policy_model, device: str):
    """The causal LM the critic starts from: `critic.path`'s, or a copy of the policy's model
    (before any LoRA wrapping). It must read the policy's token ids: same vocabulary size."""
    if not cfg.critic.path:
        return copy.deepcopy(policy_model)
    lm, _ = load_model_and_tokenizer(cfg.critic.path, load_dtype(cfg.model.precision), seed=cfg.trainer.seed)
    if lm.config.vocab_size != policy_model.config.vocab_size:
        raise ConfigError(f"critic.path={cfg.critic.path}: its vocabulary ({lm.config.vocab_size} tokens) "
                          f"is not the policy's ({policy_model.config.vocab_size}); the critic reads the "
                          "policy's ids")
    return lm.to(device)


def base_model(cfg: Config, host, role: str):
    """(the model `role` starts from, the tokenizer): "policy", "rollout" or "critic" (see the
    module docstring), on `host.device`."""
    if host.shared is None:  # a process of its own: its own load
        model, tokenizer = load_model(cfg, host.device)
        return (critic_lm(cfg, model, host.device) if role == "critic" else model), tokenizer
    if "models" not in host.shared:  # the process's first worker: every copy taken now, before any wraps
        model, tokenizer = load_model(cfg, host.device)
        models = {"policy": model}
        if needs_critic(cfg.algo.advantage):
            models["critic"] = critic_lm(cfg, model, host.device)
        models["rollout"] = copy.deepcopy(model) if cfg.model.lora.rank > 0 else model
        host.shared["models"], host.shared["tokenizer"] = models, tokenizer
    return host.shared["models"][role], host.shared["tokenizer"]
