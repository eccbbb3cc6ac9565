"""The typed configuration tree: YAML file + dotted command-line overrides.

Every key has a type, a default and, where it has one, its own constraint here, next to it:
`param(default, ge=..., choices=REGISTRY, ...)`. `load_config` rejects unknown keys (naming
the nearest one), values of the wrong type, outside their range or not among the allowed
values at start-up, naming the key's full path (e.g. `trainer.stepz`) and what is allowed,
so a typo never surfaces an hour into a run. Every number is finite: a NaN or an infinity
(YAML `.nan`, `.inf`) is refused in any float key, list item or mapping value, with the key's
range. `validate` holds only the rules that involve several keys. The allowed values of a
choice come from its registry (`reasonrl.registry`): the code that implements a choice is the
one list of them.

Checks that need more than the config (is an extra installed, can Ray place the workers)
are the preflight of `reasonrl.placement`, run before any model loads.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from reasonrl.errors import ConfigError
from reasonrl.registry import (
    ADVANTAGES,
    COUNTDOWN_SCORING,
    DATA_FORMATS,
    DATA_TASKS,
    ENGINES,
    ENVIRONMENTS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    PIECEWISE_SCORING,
    POLICY_LOSSES,
    RATIO_LEVELS,
    REWARD_COMPONENTS,
    TOOLS,
    VALUE_LOSSES,
    VERIFIERS,
    Registry,
    needs_critic,
)

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful calculator. Answer with only the final number, "
    "for example: The answer is 7."
)


def param(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
          lt: float | None = None, choices: Registry | None = None, also: tuple[str, ...] = (),
          keys: Registry | tuple[str, ...] | None = None, noun: str = "key", zero: str | None = None) -> Any:
    """A config field with its own check: a range (`ge`/`gt`/`le`/`lt`; a list's applies to each
    item), a value from a registry (`choices`, plus the fixed values `also`), or mapping keys from
    a registry or a tuple (`keys`; an unknown one is called an unknown `noun`). `zero` says what
    0 means where it switches the option off ("no clipping"); the range's message says it too."""
    meta = {k: v for k, v in dict(ge=ge, gt=gt, le=le, lt=lt, choices=choices, keys=keys, zero=zero).items()
            if v is not None}
    meta.update(also=also, noun=noun)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-5` as a number (YAML 1.2); PyYAML's YAML 1.1 rules
    need a dot (`1.0e-5`) and would hand the string "1e-5" to a float key."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


@dataclass
class LoraConfig:
    """LoRA adapters through `peft` (Hu et al. 2021, "LoRA", arXiv:2106.09685): W + (alpha/rank) B A."""

    rank: int = param(0, ge=0)  # 0 = off (full fine-tuning); e.g. 16
    alpha: float = param(32.0, gt=0)  # scale = alpha / rank
    dropout: float = param(0.0, ge=0, lt=1)
    target_modules: list[str] = param([
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    save_merged: bool = True  # checkpoints also hold huggingface/ (merged weights) beside adapter/


@dataclass
class ModelConfig:
    # "" = embedded SmolLM2-135M-Instruct, "tiny" = random test model, a folder, or a Hub id org/name
    path: str = ""
    revision: str = ""  # Hub ids: a branch, tag or commit ("" = main)
    dtype: Literal["float32", "bfloat16"] = "float32"
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class ArithmeticConfig:
    min_operand: int = 0
    max_operand: int = 9
    operators: list[Literal["+", "-", "*"]] = param(["+"])
    num_operands: int = param(2, ge=2)
    train_size: int = param(5000, ge=1)
    val_size: int = param(100, ge=0)


@dataclass
class CountdownConfig:
    min_numbers: int = param(3, ge=2, le=6)
    max_numbers: int = param(4, ge=2, le=6)
    min_number: int = param(1, ge=1)
    max_number: int = param(99, ge=1)
    min_target: int = 1
    max_target: int = 100
    train_size: int = param(2000, ge=1)
    val_size: int = param(100, ge=0)


@dataclass
class PiecewiseConfig:
    # The toy env trains (and evaluates) on the one MATH problem; variants change its constants.
    train_variants: int = param(0, ge=0)  # generated variants added to training
    val_variants: int = param(0, ge=0)  # generated variants (never trained on) added to the held-out set


DATA_FIELDS = ("prompt", "messages", "ground_truth", "data_source", "extra_info")


@dataclass
class DataConfig:
    # file: JSONL / JSON / Parquet / CSV / a `datasets` save_to_disk folder / a Hub dataset id
    task: str = param("arithmetic", choices=DATA_TASKS)
    train_path: str = ""  # for task=file: files or Hub ids (openai/gsm8k), comma-separated for several
    train_subset: str = ""  # Hub ids: the subset (configuration), e.g. main; "" = the default one
    train_split: str = "train"  # Hub ids: the split; slicing allowed (train[:80%])
    val_path: str = ""  # for task=file; empty = no held-out eval; comma-separated for several
    val_subset: str = ""
    val_split: str = "test"  # e.g. test[:5%]
    # the records' layout: "" = reasonrl's (prompt, ground_truth, ...); or a known dataset layout
    # mapped without `data prepare` (gsm8k, math, numina, countdown: reasonrl.data.formats)
    format: str = param("", choices=DATA_FORMATS, also=("",))
    # record field names when they differ, dotted for nested: {ground_truth: reward_model.ground_truth}
    fields: dict[str, str] = param({}, keys=DATA_FIELDS, noun="field")
    apply_chat_template: bool = True  # false: `prompt` is already templated text
    # used when the template is applied; "" = none; auto = the task's own: arithmetic's calculator
    # instruction (DEFAULT_SYSTEM_PROMPT), none for files and the other tasks (their prompts say it)
    system_prompt: str = "auto"
    max_prompt_tokens: int = param(256, ge=1)
    # a prompt over max_prompt_tokens: error = stop at start-up listing every such record (file:line);
    # left = keep its last max_prompt_tokens tokens (TRL's max_prompt_length truncation)
    truncate_prompts: Literal["error", "left"] = "error"
    val_size: int = param(0, ge=0)  # use at most this many held-out examples (0 = all)
    shuffle: bool = True
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    countdown: CountdownConfig = field(default_factory=CountdownConfig)
    piecewise: PiecewiseConfig = field(default_factory=PiecewiseConfig)


@dataclass
class VLLMConfig:
    # rollout.engine=vllm (README, "vLLM rollout engine"); vLLM runs in this process
    kv_cache_gib: float = param(0.0, ge=0)  # 0 = 1 GiB on CPU, on a GPU what gpu_memory_utilization leaves
    gpu_memory_utilization: float = param(0.5, gt=0, le=1)  # GPU: share of device memory for vLLM
    enforce_eager: bool = True  # no torch.compile / CUDA graphs: starts in seconds (CPU compile: minutes)
    max_model_len: int = param(0, ge=0)  # longest prompt + completion; 0 = the model's own limit
    threads: int = param(0, ge=0)  # CPU threads while generating; 0 = trainer.threads
    probe_every: int = param(1, ge=0)  # check the probe log-probs every K-th push and at start; 0 = start
    probe_tol: float = param(0.0, ge=0)  # max |engine - policy| over the probe; 0 = 1e-3 fp32, 0.5 bf16
    # GPUs each vLLM engine spreads the model over (vLLM's tensor_parallel_size); > 1 needs that many
    # GPUs per engine: placement.rollout.num_gpus in ray mode, torch.cuda.device_count() in local mode
    tensor_parallel_size: int = param(1, ge=1)


@dataclass
class RolloutConfig:
    engine: str = param("hf", choices=ENGINES)
    n: int = param(4, ge=1)  # samples per prompt (the group size G)
    temperature: float = param(1.0, gt=0)
    top_p: float = param(1.0, gt=0, le=1)
    top_k: int = param(0, ge=0)  # 0 = off
    max_new_tokens: int = param(64, ge=1)
    # hf engine: the decoder (reasonrl.accel): auto = the fastest measured on this machine for the
    # run's shapes (cached per CPU model); lean_mkl / lean = the lean Llama-family forward with /
    # without MKL-packed weights; modules = the transformers modules (any model)
    hf_decoder: Literal["auto", "lean_mkl", "lean", "modules"] = "auto"
    # hf engine, multi-turn episodes: a turn prefills only the tokens after the previous turn's
    # KV cache (kept for the episode), instead of the whole trajectory (lean decoders)
    hf_reuse_kv: bool = True
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class EnvConfig:
    """Multi-turn episodes (docs/environments.md): the model's turns alternate with an
    environment's observations, all in one trajectory per row that trains on the model's tokens."""

    # the environment (ENVIRONMENTS): tool = the model calls env.tools; feedback = "too high / too low"
    # until a numeric answer is right; none = single-turn (one model turn per prompt)
    name: str = param("none", choices=ENVIRONMENTS, also=("none",))
    fn: str = ""  # a user environment class instead, "module:Class" or "path/file.py:Class"
    tools: list[str] = param(["calculator"], keys=TOOLS, noun="tool")  # env.name=tool: the tools it offers
    # env.name=tool, how the model calls: tags = <calculator>347 * 29</calculator> (the turn stops at the
    # closing tag); tool_call = chat templates' <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    call_format: Literal["tags", "tool_call"] = "tags"
    # how an observation comes back: tagged = <output>...</output> inside the model's turn; chat = a
    # message through the chat template (role tool for a tool's output, user for feedback)
    observation_format: Literal["tagged", "chat"] = "tagged"
    max_turns: int = param(4, ge=1)  # model turns per episode; an episode still going after them is truncated
    max_turn_tokens: int = param(0, ge=0)  # model tokens per turn; 0 = rollout.max_new_tokens
    # model + environment tokens after the prompt (rollout.max_new_tokens counts model tokens); 0 = no limit
    max_total_tokens: int = param(0, ge=0)
    max_observation_tokens: int = param(256, ge=1)  # an observation's tokens past this are cut
    step_timeout: float = param(30.0, gt=0)  # seconds for one environment step (its tool call included)
    workers: int = param(8, ge=1)  # environment steps that run at once
    tool_timeout: float = param(10.0, gt=0)  # seconds per tool call (wall clock); then its processes die
    tool_memory_mb: int = param(512, ge=64)  # address space of a python tool call
    sandbox: Literal["auto", "bwrap", "unshare", "rlimit"] = "auto"  # python tool sandbox, docs/tools.md


@dataclass
class RewardConfig:
    # weighted sum of named components (the REWARD_COMPONENTS registry, reasonrl.rewards.components)
    weights: dict[str, float] = param({"correct": 1.0}, keys=REWARD_COMPONENTS, noun="reward component")
    fallback_last_number: bool = True  # no \boxed / <answer>: take the last number
    # which verifier scores `correct`: auto = from each example's data_source (README, "Tasks")
    task: str = param("auto", choices=VERIFIERS, also=("auto",))
    fn: str = ""  # custom verifier for `correct`, "module:function" or "file.py:function"
    isolate_fn: bool = True  # run reward.fn in a worker process, with reward.timeout
    timeout: float = param(5.0, gt=0)  # seconds per sample for out-of-process verifiers (math, reward.fn)
    num_workers: int = param(2, ge=1)  # reward worker processes
    countdown_format_score: float = param(0.1, ge=0, le=1)  # countdown: an equation was given but is wrong
    # countdown scoring (COUNTDOWN_SCORING): subset = each number at most once, format_score for a
    # well-formed wrong equation; tinyzero = each number exactly once, format_score for any answer
    countdown_rule: str = param("subset", choices=COUNTDOWN_SCORING)
    # piecewise scoring (PIECEWISE_SCORING): partial_credit = reasonrl's checked equations;
    # transparent_grpo = Transparent GRPO's regex credits (the canonical problem only)
    piecewise_rule: str = param("partial_credit", choices=PIECEWISE_SCORING)
    # custom batch reward for `correct`, "module:function": called once per rollout batch with all
    # completions, ground truths, group indices and extra_infos (README, "Custom rewards")
    batch_fn: str = ""
    # how components combine: sum = the weighted sum; all = the weighted sum if every weighted
    # component scores > 0, else 0. gate: components that must score > 0 for the sum to count
    combine: Literal["sum", "all"] = "sum"
    gate: list[str] = param([], keys=REWARD_COMPONENTS, noun="reward component")


@dataclass
class AlgoConfig:
    # formulas, sources and how the keys combine: docs/algorithms.md
    advantage: str = param("grpo", choices=ADVANTAGES)
    std_eps: float = param(1e-4, ge=0)
    policy_loss: str = param("ppo", choices=POLICY_LOSSES)  # ppo (clipped surrogate) | cispo | gmpo | sapo
    clip_low: float = param(0.2, ge=0)
    clip_high: float = param(0.2, ge=0)
    clip_ratio_c: float = param(0.0, ge=0)  # dual clip for negative advantages (> 1, e.g. 3); 0 = off
    ratio_level: str = param("token", choices=RATIO_LEVELS)  # sequence = GSPO
    sapo_tau_pos: float = param(1.0, gt=0)  # policy_loss=sapo: the gate's temperature for A > 0
    sapo_tau_neg: float = param(1.05, gt=0)  # ... and for A <= 0 (the paper: tau_neg > tau_pos)
    loss_agg: str = param("token", choices=LOSS_AGGREGATIONS)
    beta: float = param(0.0, ge=0)  # KL coefficient; the reference model is loaded only when > 0 (or log_kl)
    kl_estimator: str = param("k3", choices=KL_ESTIMATORS)
    kl_in: Literal["reward", "loss"] = "loss"
    log_kl: bool = False  # load the reference model even when beta = 0, to log train/kl
    entropy_coef: float = 0.0  # loss -= entropy_coef * entropy (aggregated like the loss)
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal, resample
    dynamic_sampling_tol: float = param(1e-6, ge=0)  # a group is flat when its reward std <= this
    max_resample: int = param(3, ge=0)  # extra sampling rounds to refill the batch (dynamic_sampling)
    overlong_buffer: int = param(0, ge=0)  # DAPO soft overlong penalty over the last N tokens; 0 = off
    overlong_penalty: float = param(1.0, ge=0)  # the penalty at the full length (max_new_tokens)
    mask_truncated: bool = False  # completions cut at max_new_tokens get no loss (DAPO)
    # truncated importance sampling: per-token loss x min(pi_old / pi_engine, tis_cap); 0 = off
    tis_cap: float = param(0.0, ge=0)  # needs an engine reporting its sampler log-probs (rollout.engine=vllm)
    # critic estimators (algo.advantage=gae, PPO): discount and GAE lambda over completion tokens
    gamma: float = param(1.0, ge=0, le=1)
    lam: float = param(1.0, ge=0, le=1)
    whiten_advantages: bool = True  # token advantages -> zero mean, unit variance over the batch (gae)


@dataclass
class OptimConfig:
    lr: float = param(1e-5, ge=0)
    weight_decay: float = param(0.0, ge=0)
    betas: list[float] = param([0.9, 0.99], ge=0, lt=1)  # AdamW's (beta1, beta2), each in [0, 1)
    eps: float = param(1e-8, ge=0)
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_ratio: float = param(0.0, ge=0, lt=1)
    min_lr_ratio: float = param(0.0, ge=0, le=1)
    max_grad_norm: float = param(1.0, ge=0, zero="no clipping")  # > 0: clip to this norm; 0 = no clipping
    micro_batch_size: int = param(8, ge=1)  # sequences per forward/backward; the gradient does not change
    # run each prompt once per micro-batch for all its completions (a GRPO group shares it):
    # same log-probs and gradient, fewer tokens through the model
    share_prompt: bool = True
    # Llama-family models: RMSNorm and SwiGLU that recompute their pointwise activations in
    # the backward, attention with native GQA: same gradient, ~40 % less activation memory
    lean_kernels: bool = True
    # recompute each decoder layer's activations in the backward (policy and reference): the same
    # gradient, memory for activations ~ one layer's instead of all layers' (docs/performance.md)
    gradient_checkpointing: bool = False
    mini_batches: int = param(1, ge=1)  # optimizer steps per pass over the batch
    ppo_epochs: int = param(1, ge=1)  # passes over the batch; > 1 (or mini_batches > 1): off-policy updates


@dataclass
class CriticConfig:
    """The value model of critic estimators (algo.advantage=gae): the policy's architecture with
    a scalar head (zero-initialised), trained by the clipped value loss (docs/algorithms.md)."""

    path: str = ""  # "" = start from the policy's model (model.path); or another HF model folder
    lr: float = param(1e-5, gt=0)
    weight_decay: float = param(0.0, ge=0)
    max_grad_norm: float = param(1.0, ge=0, zero="no clipping")  # > 0: clip to this norm; 0 = no clipping
    value_loss: str = param("clipped", choices=VALUE_LOSSES)  # the critic's loss (VALUE_LOSSES)
    cliprange_value: float = param(0.5, ge=0)  # PPO's value clipping around the old values; 0 = off
    warmup_steps: int = param(0, ge=0)  # steps that train only the critic before the policy moves
    micro_batch_size: int = param(0, ge=0)  # 0 = optim.micro_batch_size


@dataclass
class EvalConfig:
    """Held-out evaluation's own sampling (the trainer's eval and `reasonrl eval`; its options
    fill these). A record's `extra_info.n` / `extra_info.pass@k` override n and add its k."""

    n: int = param(1, ge=1)  # samples per prompt
    temperature: float = param(0.0, ge=0)  # 0 = greedy (argmax; needs n = 1)
    top_p: float = param(1.0, gt=0, le=1)
    top_k: int = param(0, ge=0)  # 0 = off
    max_new_tokens: int = param(0, ge=0)  # 0 = rollout.max_new_tokens
    k: list[int] = param([])  # pass@k values, each <= n; [] = 1 and n


@dataclass
class TrainerConfig:
    steps: int = param(20, ge=1)
    # > 0: train this many passes over the training prompts instead (steps = ceil(epochs x prompts /
    # prompts per step), printed at start-up); trainer.steps is then not used
    epochs: float = param(0.0, ge=0)
    batch_size: int = param(32, ge=1)  # completions per optimizer step; a multiple of rollout.n
    seed: int = 0
    eval_every: int = param(0, ge=0)  # 0 = only before and after training
    save_every: int = param(0, ge=0)  # 0 = only at the end
    log_samples: int = param(4, ge=0)  # completions written to samples.jsonl per step
    output_dir: str = "runs"
    run_name: str = ""  # "" = a timestamp
    threads: int = param(0, ge=0)  # torch intra-op threads; 0 = one per core
    progress: bool = True
    # "" = a new run; "auto" = continue output_dir/run_name from its newest checkpoint if it
    # has one (else start it); a run or checkpoint folder = continue from there
    resume: str = ""
    allow_config_change: list[str] = param([])  # keys a resume may change
    keep_last: int = param(2, ge=0)  # checkpoints kept (oldest deleted first); 0 = all
    max_bad_steps: int = param(5, ge=1)  # abort after this many steps in a row with a non-finite loss/grad


@dataclass
class WorkerPlacement:
    """Ray resources of one worker actor (each policy rank is one actor)."""

    num_cpus: float = param(1.0, ge=0)
    num_gpus: float = param(0.0, ge=0)  # may be fractional: 0.5 + 0.5 share one GPU
    resources: dict[str, float] = param({})  # custom resources, e.g. {node_a: 1}


@dataclass
class PolicyPlacement(WorkerPlacement):
    ranks: int = param(1, ge=1)  # data-parallel ranks (torch.distributed + FSDP2); > 1 needs mode=ray
    # FSDP2 ranks (ranks > 1): true = free each layer's gathered weights after its forward and gather
    # them again for the backward (ZeRO-3); false = keep them until the backward (ZeRO-2: fewer
    # all-gathers, a layer's full weights per layer in memory between forward and backward)
    reshard_after_forward: bool = True
    # FSDP2 ranks: keep the weight, gradient and AdamW shards in CPU memory, copied to the GPU per
    # layer for compute (FSDP2's CPUOffloadPolicy; DeepSpeed's offload); the optimizer steps on the CPU
    cpu_offload: bool = False


@dataclass
class RolloutPlacement(WorkerPlacement):
    replicas: int = param(1, ge=1)  # rollout actors, each with its own engine and these resources; > 1: ray


@dataclass
class PlacementConfig:
    # local: workers in this process; ray: each worker is a Ray actor (docs/scaling.md)
    mode: Literal["local", "ray"] = "local"
    # local mode: where the policy and the colocated rollout engine live. auto = cuda when
    # torch sees a GPU, else cpu; or cpu, cuda, cuda:N (ray mode: placement.<worker>.num_gpus)
    device: str = "auto"
    # ray: "" = start a Ray instance for this run; "auto" = the cluster of `ray start --head`
    # on this machine; or host:port / ray://host:10001
    address: str = ""
    num_cpus: int = param(0, ge=0)  # CPUs of the Ray instance a run starts itself (0 = all); not for address
    start_timeout: float = param(180.0, gt=0)  # seconds for a worker actor to be scheduled and built
    call_timeout: float = param(3600.0, gt=0)  # seconds for one remote call (a step, a sync, an eval chunk)
    # torch.distributed backend of the policy ranks; auto = nccl when the ranks have GPUs, else gloo
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    # ray mode: a weight sync moves the policy's weights to the rollout replicas in buckets of at most
    # this many MB (a tensor larger than that travels alone): the extra memory of a sync per process
    sync_bucket_mb: float = param(512.0, gt=0)
    policy: PolicyPlacement = field(default_factory=PolicyPlacement)
    rollout: RolloutPlacement = field(default_factory=RolloutPlacement)
    critic: PolicyPlacement = field(default_factory=PolicyPlacement)  # algo.advantage=gae


@dataclass
class WandbConfig:
    project: str = "reasonrl"
    entity: str = ""  # "" = your default entity
    name: str = ""  # "" = the run directory's name
    group: str = ""
    tags: list[str] = param([])
    # offline: no network, files under <run>/wandb/ (upload later with `wandb sync`)
    mode: Literal["offline", "online", "disabled"] = "offline"


@dataclass
class TrackingConfig:
    # metrics.jsonl and samples.jsonl are always written; console = the progress bar
    backends: list[Literal["console", "jsonl", "tensorboard", "wandb"]] = param(["console", "jsonl"])
    tensorboard_dir: str = ""  # "" = <run>/tensorboard
    wandb: WandbConfig = field(default_factory=WandbConfig)
    report: bool = True  # write <run>/report.html at the end of training


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


def _coerce(value: Any, tp: Any, path: str, meta: Any = None) -> Any:
    """Check `value` against the annotation `tp` and convert int->float; raise ConfigError.
    A float must be finite; its message states the field's range from `meta` (a list's items
    are checked with the list's range)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a section (mapping), got {value!r}")
        return _build(tp, value, path)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{path}: {value!r} is not allowed; allowed values: "
                              f"{', '.join(map(str, allowed))}")
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        return [_coerce(v, item_tp, f"{path}[{i}]", meta) for i, v in enumerate(value)]
    if origin is dict:
        key_tp, item_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return {_coerce(k, key_tp, path): _coerce(v, item_tp, f"{path}.{k}")
                for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"{path}: union types are not supported in the config tree")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        if not math.isfinite(value):
            bounds = _range_text(meta).removeprefix("must be ") if meta and _has_range(meta) else ""
            rule = f"must be finite and {bounds}" if bounds else "must be a finite number"
            raise ConfigError(f"{path}: {rule}, got {float(value)!r}")
        return float(value)
    if tp is str:
        if value is None:
            return ""
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return str(value)
    raise TypeError(f"{path}: unsupported annotation {tp!r}")


def _has_range(meta: Any) -> bool:
    return any(k in meta for k in ("ge", "gt", "le", "lt"))


def _range_text(meta: dict) -> str:
    """"must be >= 1", "must be in (0, 1]", "must be > 0 (0 = no clipping)" from a field's bounds."""
    low = ("[", meta["ge"]) if "ge" in meta else ("(", meta["gt"]) if "gt" in meta else None
    high = (meta["le"], "]") if "le" in meta else (meta["lt"], ")") if "lt" in meta else None
    if low and high:
        return f"must be in {low[0]}{low[1]:g}, {high[0]:g}{high[1]}"
    if "zero" in meta and low == ("[", 0):
        return f"must be > 0, or 0 for {meta['zero']}"
    if low:
        return f"must be {'>=' if low[0] == '[' else '>'} {low[1]:g}"
    return f"must be {'<=' if high[1] == ']' else '<'} {high[0]:g}"


def _check(value: Any, meta: Any, path: str) -> None:
    """A field's own constraint (`param`): its range, its allowed values or mapping keys."""
    if not meta:
        return
    if isinstance(value, list) and _has_range(meta):  # a list's range holds for each item
        for i, item in enumerate(value):
            _check(item, meta, f"{path}[{i}]")
        return
    ok = all((("ge" not in meta or value >= meta["ge"]), ("gt" not in meta or value > meta["gt"]),
              ("le" not in meta or value <= meta["le"]), ("lt" not in meta or value < meta["lt"])))
    if not ok:
        raise ConfigError(f"{path}: {_range_text(meta)}, got {value!r}")
    if "choices" in meta and value not in meta["also"] and value not in meta["choices"]:
        allowed = (*meta["also"], *meta["choices"].names())
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        listed = ", ".join(a or '""' for a in allowed)
        raise ConfigError(f"{path}: {value!r} is not allowed{hint}; allowed values: {listed}")
    if "keys" in meta:
        allowed = meta["keys"] if isinstance(meta["keys"], tuple) else meta["keys"].names()
        for key in value:
            if key not in allowed:
                raise ConfigError(f"{path}.{key}: unknown {meta['noun']}; allowed: {', '.join(allowed)}")


MOVED = {"rollout.eval_max_new_tokens": "eval.max_new_tokens"}  # keys that moved: old -> new


def _build(cls: type, data: dict, path: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = f"{path}.{key}" if path else str(key)
        if full in MOVED:
            raise ConfigError(f"{full} is now {MOVED[full]} (with the other evaluation settings): "
                              f"set {MOVED[full]}={value!r}")
        if key not in hints:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown config key {full!r}{hint}; allowed keys"
                              f"{' in ' + path if path else ''}: {', '.join(fields)}")
        kwargs[key] = _coerce(value, hints[key], full, fields[key].metadata)
        _check(kwargs[key], fields[key].metadata, full)
    return cls(**kwargs)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`trainer.steps=50` -> ("trainer.steps", 50); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected dotted.key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.load(raw, Loader=_YamlLoader) if raw != "" else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"override {text!r}: cannot parse value: {err}") from err
    return key.strip(), value


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | tuple = ()) -> Config:
    """Defaults <- YAML file (which may `include:` a base file) <- dotted overrides."""
    tree: dict = {}
    if path is not None:
        tree = _read_yaml(Path(path))
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(tree, key, value)
    cfg = _build(Config, tree)
    validate(cfg)
    return cfg


def _read_yaml(path: Path, depth: int = 0) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        tree = yaml.load(path.read_text(), Loader=_YamlLoader) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {err}") from err
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    base = tree.pop("include", None)
    if base is not None:
        if depth > 8:
            raise ConfigError(f"{path}: include nesting too deep")
        tree = _merge(_read_yaml(path.parent / str(base), depth + 1), tree)
    return tree


DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_device(name: str) -> None:
    """`placement.device` names a device this machine has (ConfigError otherwise)."""
    if not DEVICE.match(name):
        raise ConfigError(f"placement.device: {name!r} is not allowed; allowed values: auto, cpu, "
                          "cuda, cuda:N")
    if not name.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"placement.device: {name} requested but torch.cuda.is_available() is False "
                          "(use auto or cpu)")
    index = int(name.partition(":")[2] or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"placement.device: {name} requested but torch sees {count} GPU(s) "
                          f"(cuda:0 to cuda:{count - 1})")


def resolve_device(name: str) -> str:
    """The torch device of `placement.device`: auto = cuda when torch sees a GPU, else cpu."""
    if name == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def validate(cfg: Config) -> None:
    """The rules that involve several keys (each field's own check is in its `param`);
    each error names the key to change."""

    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ConfigError(msg)

    r, t, o, a, d = cfg.rollout, cfg.trainer, cfg.optim, cfg.algo, cfg.data
    lo, pl = cfg.model.lora, cfg.placement
    singles = ", ".join(e.name for e in ADVANTAGES if not e.info["needs_groups"])
    need(not ADVANTAGES[a.advantage].info["needs_groups"] or r.n >= 2,
         f"rollout.n: group advantages ({a.advantage}) need n >= 2 samples per prompt, got {r.n}; "
         f"advantages that work with n = 1: {singles}")
    need(t.batch_size >= r.n and t.batch_size % r.n == 0,
         f"trainer.batch_size: {t.batch_size} completions do not divide into groups of "
         f"rollout.n={r.n}; use a multiple of {r.n}")
    need(len(o.betas) == 2, f"optim.betas: expected two numbers, got {o.betas}")
    need(a.clip_ratio_c == 0 or a.clip_ratio_c > 1,
         f"algo.clip_ratio_c: must be 0 (off) or > 1, got {a.clip_ratio_c}")
    need(not a.dynamic_sampling or r.n >= 2,
         f"algo.dynamic_sampling: needs rollout.n >= 2 (a group of one is always flat), got {r.n}")
    need(a.overlong_buffer < r.max_new_tokens,
         f"algo.overlong_buffer: must be in [0, rollout.max_new_tokens={r.max_new_tokens}), "
         f"got {a.overlong_buffer}")
    need(o.mini_batches <= t.batch_size, f"optim.mini_batches: {o.mini_batches} is more than "
         f"trainer.batch_size={t.batch_size} completions")
    with_logprobs = [e.name for e in ENGINES if e.info["logprobs"]]
    need(a.tis_cap == 0 or r.engine in with_logprobs,
         f"algo.tis_cap: needs the sampler's log-probs, which rollout.engine={r.engine} does not "
         f"report; engines that do: {', '.join(with_logprobs)}")
    critic = needs_critic(a.advantage)
    if not critic:
        changed = [f"critic.{f.name}" for f in dataclasses.fields(CriticConfig)
                   if getattr(cfg.critic, f.name) != getattr(CriticConfig(), f.name)]
        changed += [f"placement.critic.{k}" for k, v in dataclasses.asdict(pl.critic).items()
                    if v != getattr(PolicyPlacement(), k)]
        critics = ", ".join(e.name for e in ADVANTAGES if needs_critic(e.name))
        need(not changed, f"{', '.join(changed)}: set, but algo.advantage={a.advantage} uses no critic; "
             f"estimators with a critic: {critics} (or remove the critic settings)")
    need(critic or (a.gamma, a.lam) == (1.0, 1.0),
         f"algo.gamma/algo.lam: only used by critic estimators (GAE); algo.advantage={a.advantage} has none")
    need(pl.critic.ranks == 1 or pl.mode == "ray",
         f"placement.critic.ranks: {pl.critic.ranks} ranks need placement.mode=ray")
    need(bool(cfg.reward.weights), "reward.weights: at least one component is needed")
    rw, ev = cfg.reward, cfg.eval
    for g in rw.gate:
        need(g in rw.weights, f"reward.gate: {g!r} is not in reward.weights, so it is not computed; add it "
             "there (weight 0 gates without adding to the sum)")
    need(not (rw.fn and rw.batch_fn), "reward.fn and reward.batch_fn: set one (both replace `correct`)")
    need(not rw.batch_fn or (":" in rw.batch_fn and all(rw.batch_fn.rpartition(":")[::2])),
         f"reward.batch_fn: expected module:function or path/file.py:function, got {rw.batch_fn!r}")
    need(rw.piecewise_rule != "transparent_grpo" or d.task != "piecewise"
         or d.piecewise.train_variants == d.piecewise.val_variants == 0,
         "reward.piecewise_rule=transparent_grpo scores the canonical problem only: set "
         "data.piecewise.train_variants=0 and data.piecewise.val_variants=0")
    need(ev.temperature > 0 or ev.n == 1,
         f"eval.n: greedy evaluation (eval.temperature=0) gives n identical samples; use eval.n=1 or "
         f"eval.temperature > 0, got n={ev.n}")
    for k in ev.k:
        need(1 <= k <= ev.n, f"eval.k: pass@{k} needs 1 <= k <= eval.n={ev.n}")
    need(not rw.fn or (":" in rw.fn and all(rw.fn.rpartition(":")[::2])),
         f"reward.fn: expected module:function or path/file.py:function, got {rw.fn!r}")
    if not DATA_TASKS[d.task].info["generated"]:
        need(bool(d.train_path), f"data.train_path: required when data.task={d.task}")
    cd, ar = d.countdown, d.arithmetic
    need(cd.min_numbers <= cd.max_numbers, "data.countdown: need 2 <= min_numbers <= max_numbers <= 6")
    need(cd.min_number <= cd.max_number, "data.countdown: need 1 <= min_number <= max_number")
    need(cd.min_target <= cd.max_target, "data.countdown: min_target > max_target")
    need(ar.min_operand <= ar.max_operand, "data.arithmetic: min_operand > max_operand")
    need(lo.rank == 0 or bool(lo.target_modules), "model.lora.target_modules: at least one module name")
    need(pl.policy.ranks == 1 or pl.mode == "ray",
         f"placement.policy.ranks: {pl.policy.ranks} ranks need placement.mode=ray")
    need(pl.rollout.replicas == 1 or pl.mode == "ray",
         f"placement.rollout.replicas: {pl.rollout.replicas} replicas need placement.mode=ray")
    for role in ("policy", "critic"):
        w = getattr(pl, role)
        for key, default in (("reshard_after_forward", True), ("cpu_offload", False)):
            need(getattr(w, key) == default or w.ranks > 1,
                 f"placement.{role}.{key}: applies to FSDP2 ranks; set placement.{role}.ranks > 1 "
                 f"(it is {w.ranks})")
    tp = r.vllm.tensor_parallel_size
    need(tp == 1 or r.engine == "vllm",
         f"rollout.vllm.tensor_parallel_size: {tp} is vLLM's; rollout.engine={r.engine} runs on one device")
    need(tp == 1 or pl.mode == "local" or pl.rollout.num_gpus == tp,
         f"rollout.vllm.tensor_parallel_size: {tp} GPUs per engine need placement.rollout.num_gpus={tp} "
         f"(each rollout replica's actor must see {tp} GPUs), got {pl.rollout.num_gpus:g}")
    for role, w in (("policy", pl.policy), ("rollout", pl.rollout), ("critic", pl.critic)):
        need(w.num_gpus <= 1 or w.num_gpus == int(w.num_gpus),
             f"placement.{role}.num_gpus: a fraction must be < 1 (0.5 shares a GPU), got {w.num_gpus}")
        for name, amount in w.resources.items():
            need(amount > 0, f"placement.{role}.resources.{name}: must be > 0, got {amount}")
    for section in ("num_gpus", "resources"):
        need(pl.mode == "ray" or getattr(pl.policy, section) == getattr(WorkerPlacement(), section)
             and getattr(pl.rollout, section) == getattr(WorkerPlacement(), section)
             and getattr(pl.critic, section) == getattr(WorkerPlacement(), section),
             f"placement.policy/rollout/critic.{section}: only used with placement.mode=ray")
    check_device(pl.device)
    need(pl.mode == "local" or pl.device == "auto",
         f"placement.device: {pl.device} is only used with placement.mode=local; in ray mode a worker "
         "is on a GPU when placement.<worker>.num_gpus > 0")
    need(pl.backend != "nccl" or pl.policy.num_gpus > 0,
         "placement.backend: nccl needs GPUs (placement.policy.num_gpus > 0)")
    validate_env(cfg)


def validate_env(cfg: Config) -> None:
    """The `env` section's rules across keys (multi-turn episodes)."""
    e, r = cfg.env, cfg.rollout
    if e.fn:
        if e.name != "none":
            raise ConfigError(f"env.fn and env.name: set one (env.fn={e.fn!r} replaces the built-in "
                              f"env.name={e.name!r})")
        if ":" not in e.fn or not all(e.fn.rpartition(":")[::2]):
            raise ConfigError(f"env.fn: expected module:Class or path/file.py:Class, got {e.fn!r}")
    if e.name == "none" and not e.fn:
        changed = [f"env.{f.name}" for f in dataclasses.fields(EnvConfig)
                   if f.name != "name" and getattr(e, f.name) != getattr(EnvConfig(), f.name)]
        if changed:
            raise ConfigError(f"{', '.join(changed)}: set, but env.name=none runs single-turn episodes; "
                              "set env.name (tool, feedback) or env.fn, or remove them")
        return
    if e.name == "tool":
        if not e.tools:
            raise ConfigError("env.tools: env.name=tool needs at least one tool")
        if e.step_timeout <= e.tool_timeout:
            raise ConfigError(f"env.step_timeout: {e.step_timeout:g} s must be more than env.tool_timeout="
                              f"{e.tool_timeout:g} s (a step runs one tool call)")
    if e.max_turn_tokens > r.max_new_tokens:
        raise ConfigError(f"env.max_turn_tokens: {e.max_turn_tokens} is more than rollout.max_new_tokens="
                          f"{r.max_new_tokens}, which counts every model token of an episode; use at most "
                          "that")
    if e.max_total_tokens and e.max_total_tokens < min(e.max_turn_tokens or r.max_new_tokens,
                                                       r.max_new_tokens):
        raise ConfigError(f"env.max_total_tokens: {e.max_total_tokens} is less than one model turn "
                          f"({e.max_turn_tokens or r.max_new_tokens} tokens); raise it or lower "
                          "env.max_turn_tokens")


def after_prompt(cfg: Config, model_tokens: int, key: str) -> tuple[int, str, str]:
    """(the most tokens a sequence holds after its prompt, how they add up, the keys that lower
    them) when the model samples at most `model_tokens` (`key`): those alone in a single-turn
    run; in a multi-turn one plus an observation of at most env.max_observation_tokens after each
    turn but the last, capped by env.max_total_tokens (`reasonrl.rollout.episodes`)."""
    e = cfg.env
    if e.name == "none" and not e.fn:
        return model_tokens, f"{key}={model_tokens}", key
    tokens = model_tokens + (e.max_turns - 1) * e.max_observation_tokens
    if e.max_total_tokens and e.max_total_tokens < tokens:
        return e.max_total_tokens, f"env.max_total_tokens={e.max_total_tokens}", "env.max_total_tokens"
    return (tokens, f"{key}={model_tokens} + (env.max_turns={e.max_turns} - 1) x "
            f"env.max_observation_tokens={e.max_observation_tokens}",
            f"{key}, env.max_observation_tokens or env.max_total_tokens")


def check_context(cfg: Config, positions: int, source: str, model: str = "the model") -> None:
    """ConfigError when the longest sequence the run can build is longer than `positions`,
    `model`'s context (max_position_embeddings; `source` says where it was read), or than
    rollout.vllm.max_model_len when that is set lower: data.max_prompt_tokens plus the tokens
    after the prompt (`after_prompt`, for rollout.max_new_tokens and for eval.max_new_tokens).
    A prompt longer than data.max_prompt_tokens is listed at start-up or cut to it
    (data.truncate_prompts), so once this passes every prompt and its completion fit."""
    r, d = cfg.rollout, cfg.data
    limit, what = positions, f"{model}'s context of {positions} positions ({source})"
    if r.engine == "vllm" and 0 < r.vllm.max_model_len < positions:
        limit, what = r.vllm.max_model_len, f"rollout.vllm.max_model_len={r.vllm.max_model_len} ({what})"
    budgets = [("rollout.max_new_tokens", r.max_new_tokens)]
    if cfg.eval.max_new_tokens > r.max_new_tokens:  # the held-out evaluation samples longer
        budgets.append(("eval.max_new_tokens", cfg.eval.max_new_tokens))
    for key, model_tokens in budgets:
        after, how, keys = after_prompt(cfg, model_tokens, key)
        total = d.max_prompt_tokens + after
        if total <= limit:
            continue
        room = limit - after
        fix = (f"lower data.max_prompt_tokens to at most {room}, or {keys}" if room >= 1 else
               f"the {after} tokens after the prompt alone leave no room for it: lower {keys}")
        raise ConfigError(f"data.max_prompt_tokens={d.max_prompt_tokens} + {how} = {total} tokens, more "
                          f"than {what}: {fix}")


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
