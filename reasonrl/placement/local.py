"""The workers built in this process (placement.mode=local), and the factories every mode
uses to build one: `load_model`, `make_policy`, `make_critic`, `make_rollout`, `make_teacher` (a
Ray actor calls them too, on its own machine).

The policy and rollout workers are plain objects on `placement.device` (auto = the GPU when
torch sees one); the HF rollout engine shares the policy's model (a weight sync copies
nothing and is verified by checksum), except with LoRA, where the engine holds a plain copy
(on the same device) and receives the merged weights. A teacher (on-policy distillation,
`teacher.path`) is a plain object here too, its own model beside the policy's, and no weight
sync reaches it (`WeightSync` moves the policy's weights to the rollout worker alone).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from reasonrl.config import Config, resolve_device
from reasonrl.data import system_prompt_for
from reasonrl.envs import environment_spec
from reasonrl.errors import ConfigError
from reasonrl.placement.sync import InProcessCopy, WeightSync
from reasonrl.policy.critic import CriticWorker, ValueModel
from reasonrl.policy.model import load_model_and_tokenizer
from reasonrl.policy.precision import cast_for_compute, load_dtype
from reasonrl.policy.teacher import TeacherSettings, TeacherWorker, teacher_model
from reasonrl.policy.worker import PolicySettings, PolicyWorker
from reasonrl.registry import needs_critic
from reasonrl.rewards.model_reward import close_hosts
from reasonrl.rollout import RolloutWorker, make_engine
from reasonrl.worker_protocols import CriticWorkerAPI, PolicyWorkerAPI, RolloutWorkerAPI, TeacherWorkerAPI


@dataclass
class Workers:
    """What `build_workers` returns: the workers the trainer calls (plain objects or Ray
    proxies), the tokenizer, and the weight sync from the policy to the rollout engine(s)."""

    policy: PolicyWorkerAPI
    rollout: RolloutWorkerAPI
    tokenizer: object
    sync: WeightSync
    critic: CriticWorkerAPI | None = None  # critic estimators (algo.advantage=gae) only
    teacher: TeacherWorkerAPI | None = None  # on-policy distillation (teacher.path) only
    actors: list = field(default_factory=list)  # ray mode: the actor handles, for close()

    def close(self) -> None:
        """Free the workers: engines closed (vLLM's memory and process state), Ray actors
        stopped, reward.model's worker or actor stopped. Safe to call twice."""
        workers = (self.rollout, self.policy, self.critic, self.teacher)
        self.policy = self.rollout = self.critic = self.teacher = self.sync = None
        try:
            for worker in workers:
                if worker is not None:
                    worker.close()
        finally:
            if self.actors:
                from reasonrl.placement.proxies import stop_actors

                stop_actors(self.actors)
                self.actors = []
            close_hosts()  # the run's reward-model worker (or actor): started by its scoring


def load_model(cfg: Config, device: str = "cpu"):
    """(model, tokenizer) of `model.path` on `device`, in the dtype `model.precision` loads in
    (`reasonrl.policy.precision.load_dtype`: fp32 unless pure bf16)."""
    model, tokenizer = load_model_and_tokenizer(cfg.model.path, load_dtype(cfg.model.precision),
                                                seed=cfg.trainer.seed, revision=cfg.model.revision)
    return model.to(device), tokenizer


def make_policy(cfg: Config, model, tokenizer) -> PolicyWorker:
    """The policy worker around `model` (wrapped in a LoRA adapter when `model.lora.rank` > 0)."""
    lo = cfg.model.lora
    if lo.rank > 0:
        from reasonrl.policy.lora import apply_lora

        model = apply_lora(model, lo.rank, lo.alpha, lo.dropout, lo.target_modules, seed=cfg.trainer.seed)
    return PolicyWorker(model, tokenizer.pad_token_id, PolicySettings.from_config(cfg))


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


def value_model(cfg: Config, lm) -> ValueModel:
    """`lm` with a zero value head (and the policy's LoRA settings: adapters on the body, the
    head trained in full)."""
    lo = cfg.model.lora
    if lo.rank > 0:
        from reasonrl.policy.lora import apply_lora

        lm = apply_lora(lm, lo.rank, lo.alpha, lo.dropout, lo.target_modules, seed=cfg.trainer.seed + 1)
    return ValueModel(lm)


def make_critic(cfg: Config, lm, tokenizer) -> CriticWorker:
    return CriticWorker(value_model(cfg, lm), tokenizer.pad_token_id, cfg.critic, cfg.optim,
                        precision=cfg.model.precision)


def make_teacher(cfg: Config, device: str = "cpu") -> TeacherWorker:
    """The teacher of on-policy distillation: `teacher.path`'s model on `device`, scoring in the
    run's compute precision (`reasonrl.policy.teacher`); nothing trains it or syncs to it."""
    model, tokenizer = teacher_model(cfg, device)
    return TeacherWorker(model, tokenizer.pad_token_id, TeacherSettings.from_config(cfg))


def make_rollout(cfg: Config, model, tokenizer) -> RolloutWorker:
    # hf shares `model`; vllm starts from a copy of its weights. The engine computes in the
    # precision's compute dtype (a policy's model shared here is cast already by its learner)
    cast_for_compute(model, cfg.model.precision)
    engine = make_engine(cfg.rollout.engine, model, tokenizer, cfg.rollout, cfg.trainer.threads)
    d = cfg.data
    return RolloutWorker(engine, tokenizer, d.apply_chat_template, system_prompt_for(d), d.max_prompt_tokens,
                         d.truncate_prompts, env=environment_spec(cfg.env))


def rollout_process_worker(cfg: Config) -> RolloutWorker:
    """The rollout worker of asynchronous training's rollout process (placement.mode=local,
    trainer.max_staleness > 0): its own model on `placement.device` and its own engine, whose
    weights arrive by `SharedMemory` (`reasonrl.source`)."""
    model, tokenizer = load_model(cfg, resolve_device(cfg.placement.device))
    return make_rollout(cfg, model, tokenizer)


def build_local_workers(cfg: Config) -> Workers:
    device = resolve_device(cfg.placement.device)
    model, tokenizer = load_model(cfg, device)
    critic = (make_critic(cfg, critic_lm(cfg, model, device), tokenizer) if needs_critic(cfg.algo.advantage)
              else None)
    # LoRA wraps the policy's model in place: the engine keeps a plain copy (merged weights)
    engine_model = copy.deepcopy(model) if cfg.model.lora.rank > 0 else model
    policy = make_policy(cfg, model, tokenizer)
    rollout = make_rollout(cfg, engine_model, tokenizer)
    teacher = make_teacher(cfg, device) if cfg.teacher.path else None
    return Workers(policy=policy, rollout=rollout, tokenizer=tokenizer, critic=critic, teacher=teacher,
                   sync=WeightSync(policy, rollout, InProcessCopy(policy, rollout)))
