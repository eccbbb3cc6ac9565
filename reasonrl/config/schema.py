"""The config's schema: one dataclass per section, each field with its type, its default and,
where it has one, its own constraint next to it: `param(default, ge=..., choices=REGISTRY, ...)`.

The allowed values of a choice come from its registry (`reasonrl.registry`): the code that
implements a choice is the one list of them. Reading YAML and overrides into this tree is
`loader.py`; the rules that involve several keys are `rules.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from reasonrl.config.agent import AgentConfig
from reasonrl.config.fields import param
from reasonrl.config.openenv import OpenEnvConfig
from reasonrl.config.placement import PlacementConfig
from reasonrl.config.reasoning_gym import ReasoningGymConfig
from reasonrl.config.reward import RewardConfig
from reasonrl.config.sft import SFTConfig
from reasonrl.config.verifiers_tasks import VerifiersConfig
from reasonrl.registry import (
    ADVANTAGES,
    DATA_FORMATS,
    DATA_TASKS,
    ENGINES,
    ENV_FORMATS,
    ENVIRONMENTS,
    IMPORTANCE_CORRECTIONS,
    IMPORTANCE_LEVELS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    LR_SCHEDULES,
    POLICY_LOSSES,
    RATIO_LEVELS,
    TOOLS,
    VALUE_LOSSES,
)

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful calculator. Answer with only the final number, "
    "for example: The answer is 7."
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
    # fp32; bf16-mixed (fp32 master weights and optimizer, bf16 forward/backward and rollout);
    # bf16 (weights and optimizer in bf16: memory); auto (bf16-mixed where measured faster here)
    precision: Literal["fp32", "bf16-mixed", "bf16", "auto"] = "fp32"
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
    reasoning_gym: ReasoningGymConfig = field(default_factory=ReasoningGymConfig)  # data.task=reasoning_gym
    verifiers: VerifiersConfig = field(default_factory=VerifiersConfig)  # data.task=verifiers


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
    # trainer.max_staleness > 0: torch threads of the rollout process; 0 = half the cores (the trainer
    # keeps all of them unless trainer.threads is set: docs/async.md)
    threads: int = param(0, ge=0)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class EnvConfig:
    """Multi-turn episodes (docs/environments.md): the model's turns alternate with an
    environment's observations, all in one trajectory per row that trains on the model's tokens."""

    # the environment (ENVIRONMENTS): tool = the model calls env.tools; feedback = "too high / too low"
    # until a numeric answer is right; none = single-turn (one model turn per prompt)
    name: str = param("none", choices=ENVIRONMENTS, also=("none",))
    fn: str = ""  # a user environment class instead, "module:Class" or "path/file.py:Class"
    # the style env.fn's class is written in (ENV_FORMATS): reasonrl = reset(example) + step(turn);
    # trl = TRL's environment_factory class (public methods are tools); skyrl = SkyRL-Gym's
    # init/step; gymnasium = reset(seed, options) + step(action) -> 5-tuple; auto = told by its methods
    format: str = param("auto", choices=ENV_FORMATS, also=("auto",))
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
    tool_disk_mb: int = param(64, ge=1)  # what a python tool call's directory may take on disk
    sandbox: Literal["auto", "bwrap", "unshare", "rlimit"] = "auto"  # python tool sandbox, docs/tools.md
    # episodes a rollout call plays at once (0 = all): more wait for the next wave, whole groups at a time
    # (a server's session limit: env.url); at least rollout.n and eval.n
    max_concurrent_episodes: int = param(0, ge=0)
    url: str = ""  # env.name=openenv: an OpenEnv server, ws://host:port or http://host:port
    openenv: OpenEnvConfig = field(default_factory=OpenEnvConfig)  # env.name=openenv, env.format=openenv
    agent: AgentConfig = field(default_factory=AgentConfig)  # env.format=agent: docs/agents.md


# reward.model.template's default: a reference-guided Yes/No question (docs/judges.md)
@dataclass
class AlgoConfig:
    # formulas, sources and how the keys combine: docs/algorithms.md
    advantage: str = param("grpo", choices=ADVANTAGES)
    std_eps: float = param(1e-4, ge=0)
    std_ddof: int = param(1, ge=0, le=1)  # the std's divisor n - ddof: 1 = unbiased (torch, TRL), 0 = np.std
    policy_loss: str = param("ppo", choices=POLICY_LOSSES)  # a POLICY_LOSSES entry (algo/policy_loss.py)
    # an out-of-tree policy loss instead: "module:function" or "path/file.py:function", with the
    # built-in losses' signature (docs/algorithms.md); loss_kwargs are its own keyword arguments
    loss_fn: str = ""
    loss_kwargs: dict[str, Any] = param({})
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
    # off-policy corrections (docs/algorithms.md): the per-token loss x a weight of
    # rho = pi_old / pi_engine; any but none needs an engine that reports its sampler log-probs
    importance_correction: str = param("none", choices=IMPORTANCE_CORRECTIONS)  # none | tis | mis | decoupled
    importance_level: str = param("token", choices=IMPORTANCE_LEVELS)  # rho per token | sequence | geometric
    importance_cap: float = param(2.0, gt=0)  # tis: truncate at; mis: upper bound; decoupled: mask above
    importance_floor: float = param(0.5, ge=0)  # mis: lower bound (IcePop's alpha), < importance_cap
    # critic estimators (algo.advantage=gae, PPO): discount and GAE lambda over completion tokens
    gamma: float = param(1.0, ge=0, le=1)
    lam: float = param(1.0, ge=0, le=1)
    whiten_advantages: bool = True  # token advantages -> zero mean, unit variance over the batch (gae)


@dataclass
class OptimConfig:
    lr: float = param(1e-5, ge=0, le=1)  # AdamW moves each weight by up to ~lr a step: > 1 only diverges
    weight_decay: float = param(0.0, ge=0)
    betas: list[float] = param([0.9, 0.99], ge=0, lt=1)  # AdamW's (beta1, beta2), each in [0, 1)
    eps: float = param(1e-8, ge=0)
    # the LR schedule after the warm-up: an LR_SCHEDULES entry (reasonrl/learn/schedules.py)
    schedule: str = param("constant", choices=LR_SCHEDULES)
    warmup_ratio: float = param(0.0, ge=0, lt=1)
    min_lr_ratio: float = param(0.0, ge=0, le=1)
    max_grad_norm: float = param(1.0, ge=0, zero="no clipping")  # > 0: clip to this norm; 0 = no clipping
    micro_batch_size: int = param(8, ge=1)  # rows per forward/backward at most; the gradient does not change
    # positions (prompt + completion, padding included) per forward/backward at most: bounds the
    # update's memory whatever the response length; 0 = auto from the model and the machine's
    # memory (reasonrl/model/budget.py: 2,048 on a CPU for a small model). The gradient does not change
    max_tokens_per_micro_batch: int = param(0, ge=0, zero="auto")
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
    lr: float = param(1e-5, gt=0, le=1)
    weight_decay: float = param(0.0, ge=0)
    max_grad_norm: float = param(1.0, ge=0, zero="no clipping")  # > 0: clip to this norm; 0 = no clipping
    value_loss: str = param("clipped", choices=VALUE_LOSSES)  # the critic's loss (VALUE_LOSSES)
    cliprange_value: float = param(0.5, ge=0)  # PPO's value clipping around the old values; 0 = off
    warmup_steps: int = param(0, ge=0)  # steps that train only the critic before the policy moves
    micro_batch_size: int = param(0, ge=0)  # 0 = optim.micro_batch_size


@dataclass
class TeacherConfig:
    """On-policy distillation (docs/teachers.md): a fixed teacher model scores every token the
    student samples, and each token's advantage gains coef x (log pi_teacher - log pi_student)
    of the sampled token, the negative per-token reverse KL (Thinking Machines' on-policy
    distillation; slime's --opd-kl-coef)."""

    # "" = no teacher; embedded = the embedded SmolLM2-135M-Instruct; tiny, an HF model folder, a
    # reasonrl checkpoint (runs/<name>/checkpoints/step_N) or a Hub id org/name, as model.path.
    # Its tokenizer must be the student's (checked at start-up)
    path: str = ""
    revision: str = ""  # Hub ids: a branch, tag or commit ("" = main)
    coef: float = param(1.0, gt=0)  # the weight of the negative reverse KL in each token's advantage
    # the weight of the task reward's advantage (algo.advantage) added to it: 0 = distillation alone
    task_weight: float = param(1.0, ge=0)


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
    # the [reasonrl] console lines: text, quiet (warnings alone) or json (one object per line);
    # "" = $REASONRL_CONSOLE, else text (reasonrl/console.py)
    console: Literal["", "text", "quiet", "json"] = ""
    # "" = a new run; "auto" = continue output_dir/run_name from its newest checkpoint if it
    # has one (else start it); a run or checkpoint folder = continue from there
    resume: str = ""
    allow_config_change: list[str] = param([])  # keys a resume may change
    keep_last: int = param(2, ge=0)  # checkpoints kept (oldest deleted first); 0 = all
    max_bad_steps: int = param(5, ge=1)  # abort after this many steps in a row with a non-finite loss/grad
    # asynchronous off-policy training: step t trains on rollouts of policy version max(0, t - K),
    # generated in a process of its own while earlier steps train; 0 = on-policy (docs/async.md)
    max_staleness: int = param(0, ge=0)


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
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)  # `reasonrl sft` (docs/sft.md)
