"""Where the workers live. The only module that decides placement.

`placement.mode=local`: policy and rollout workers are plain objects in this process,
and the HF rollout engine shares the policy's model (weight sync is a no-op share).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reasonrl.config import Config
from reasonrl.policy.model import load_model_and_tokenizer
from reasonrl.policy.worker import PolicyHyper, PolicyWorker
from reasonrl.rollout import RolloutWorker, make_engine

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Workers:
    policy: PolicyWorker
    rollout: RolloutWorker
    tokenizer: object


def policy_hyper(cfg: Config) -> PolicyHyper:
    o, a = cfg.optim, cfg.algo
    return PolicyHyper(
        lr=o.lr, weight_decay=o.weight_decay, betas=tuple(o.betas), eps=o.eps,
        schedule=o.schedule, warmup_ratio=o.warmup_ratio, min_lr_ratio=o.min_lr_ratio,
        max_grad_norm=o.max_grad_norm, micro_batch_size=o.micro_batch_size,
        mini_batches=o.mini_batches, ppo_epochs=o.ppo_epochs,
        total_steps=cfg.trainer.steps, clip_low=a.clip_low, clip_high=a.clip_high,
        clip_ratio_c=a.clip_ratio_c, ratio_level=a.ratio_level, loss_agg=a.loss_agg,
        max_response_length=cfg.rollout.max_new_tokens, beta=a.beta,
        kl_estimator=a.kl_estimator, kl_in=a.kl_in, log_kl=a.log_kl, entropy_coef=a.entropy_coef,
        temperature=cfg.rollout.temperature, tis_cap=a.tis_cap,
    )


def build_workers(cfg: Config) -> Workers:
    if cfg.placement.mode != "local":
        raise ValueError(f"placement.mode: unknown mode {cfg.placement.mode!r}; allowed: local")
    model, tokenizer = load_model_and_tokenizer(cfg.model.path, DTYPES[cfg.model.dtype],
                                                seed=cfg.trainer.seed)
    policy = PolicyWorker(model, tokenizer.pad_token_id, policy_hyper(cfg))
    # hf shares the policy's model; vllm starts from a copy of its weights
    engine = make_engine(cfg.rollout.engine, model, tokenizer, cfg.rollout, cfg.trainer.threads)
    d = cfg.data
    rollout = RolloutWorker(engine, tokenizer, d.apply_chat_template, d.system_prompt,
                            d.max_prompt_tokens)
    return Workers(policy=policy, rollout=rollout, tokenizer=tokenizer)
