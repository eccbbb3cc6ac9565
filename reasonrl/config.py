"""The typed configuration tree: YAML file + dotted command-line overrides.

Every key has a type and a default here; `load_config` rejects unknown keys and values
of the wrong type or outside the allowed set at start-up, naming the key's full path
(e.g. `trainer.stepz`) and what is allowed, so a typo never surfaces an hour into a run.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful calculator. Answer with only the final number, "
    "for example: The answer is 7."
)


class ConfigError(ValueError):
    """A bad key or value in the configuration; the message names the key path."""


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

    rank: int = 0  # 0 = off (full fine-tuning); e.g. 16
    alpha: float = 32.0  # scale = alpha / rank
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    save_merged: bool = True  # checkpoints also hold huggingface/ (merged weights) beside adapter/


@dataclass
class ModelConfig:
    path: str = ""  # "" = embedded SmolLM2-135M-Instruct, "tiny" = random test model, or a folder
    dtype: Literal["float32", "bfloat16"] = "float32"
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class ArithmeticConfig:
    min_operand: int = 0
    max_operand: int = 9
    operators: list[str] = field(default_factory=lambda: ["+"])
    num_operands: int = 2
    train_size: int = 5000
    val_size: int = 100


@dataclass
class CountdownConfig:
    min_numbers: int = 3
    max_numbers: int = 4
    min_number: int = 1
    max_number: int = 99
    min_target: int = 1
    max_target: int = 100
    train_size: int = 2000
    val_size: int = 100


@dataclass
class PiecewiseConfig:
    # The toy env trains (and evaluates) on the one MATH problem; variants change its constants.
    train_variants: int = 0  # generated variants added to training
    val_variants: int = 0  # generated variants (never trained on) added to the held-out set


DATA_FIELDS = ("prompt", "messages", "ground_truth", "data_source", "extra_info")


@dataclass
class DataConfig:
    # file: JSONL / JSON / Parquet / a `datasets` save_to_disk folder (jsonl: the same)
    task: Literal["arithmetic", "file", "jsonl", "countdown", "piecewise"] = "arithmetic"
    train_path: str = ""  # for task=file; several files: comma-separated
    val_path: str = ""  # for task=file; empty = no held-out eval; comma-separated for several
    # record field names when they differ, dotted for nested: {ground_truth: reward_model.ground_truth}
    fields: dict[str, str] = field(default_factory=dict)
    apply_chat_template: bool = True  # false: `prompt` is already templated text
    system_prompt: str = DEFAULT_SYSTEM_PROMPT  # used when the template is applied; "" = none
    max_prompt_tokens: int = 256
    val_size: int = 0  # use at most this many held-out examples (0 = all)
    shuffle: bool = True
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    countdown: CountdownConfig = field(default_factory=CountdownConfig)
    piecewise: PiecewiseConfig = field(default_factory=PiecewiseConfig)


@dataclass
class VLLMConfig:
    # rollout.engine=vllm (README, "vLLM rollout engine"); vLLM runs in this process
    kv_cache_gib: float = 0.0  # KV cache size; 0 = 1 GiB on CPU, on a GPU what gpu_memory_utilization leaves
    gpu_memory_utilization: float = 0.5  # GPU: share of device memory for vLLM (0.5 + 0.5 with the policy)
    enforce_eager: bool = True  # no torch.compile / CUDA graphs: starts in seconds (CPU compile: minutes)
    max_model_len: int = 0  # longest prompt + completion; 0 = the model's own limit
    threads: int = 0  # CPU threads while generating; 0 = trainer.threads (generation and update alternate)
    probe_every: int = 1  # check the probe log-probs after every K-th push (and at start); 0 = start only
    probe_tol: float = 0.0  # max |engine - policy| over the probe's log-probs; 0 = 1e-3 fp32, 0.5 bf16


@dataclass
class RolloutConfig:
    engine: Literal["hf", "vllm"] = "hf"
    n: int = 4  # samples per prompt (the group size G)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 64
    eval_max_new_tokens: int = 0  # 0 = same as max_new_tokens
    # hf engine, Llama-family models: decode with reasonrl.rollout.llama (same mathematics,
    # ~2x the tokens/s of the transformers modules on CPU); false = the transformers modules
    hf_lean: bool = True
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class RewardConfig:
    # weighted sum of named components (see reasonrl.rewards.REWARD_COMPONENTS)
    weights: dict[str, float] = field(default_factory=lambda: {"correct": 1.0})
    fallback_last_number: bool = True  # no \boxed / <answer>: take the last number
    # which verifier scores `correct`: auto = from each example's data_source (README, "Tasks")
    task: Literal["auto", "numeric", "gsm8k", "math", "countdown", "piecewise"] = "auto"
    fn: str = ""  # custom verifier for `correct`, "module:function" or "file.py:function"
    isolate_fn: bool = True  # run reward.fn in a worker process, with reward.timeout
    timeout: float = 5.0  # seconds per sample for out-of-process verifiers (math, reward.fn)
    num_workers: int = 2  # reward worker processes
    countdown_format_score: float = 0.1  # countdown: an equation was given but is wrong (verl)


@dataclass
class AlgoConfig:
    # formulas, sources and how the keys combine: docs/algorithms.md
    advantage: Literal["raw", "grpo", "grpo_no_std", "dr_grpo", "rloo", "reinforce_pp",
                       "reinforce_pp_baseline"] = "grpo"
    std_eps: float = 1e-4
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_ratio_c: float = 0.0  # dual clip for negative advantages (> 1, e.g. 3); 0 = off
    ratio_level: Literal["token", "sequence"] = "token"  # sequence = GSPO
    loss_agg: Literal["token", "sequence", "seq_mean_token_sum", "seq_mean_token_sum_norm"] = "token"
    beta: float = 0.0  # KL coefficient; the reference model is loaded only when > 0 (or log_kl)
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    kl_in: Literal["reward", "loss"] = "loss"
    log_kl: bool = False  # load the reference model even when beta = 0, to log train/kl
    entropy_coef: float = 0.0  # loss -= entropy_coef * entropy (aggregated like the loss)
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal, resample
    dynamic_sampling_tol: float = 1e-6  # a group is flat when its reward std <= this
    max_resample: int = 3  # extra sampling rounds to refill the batch (dynamic_sampling)
    overlong_buffer: int = 0  # DAPO soft overlong penalty over the last N tokens; 0 = off
    overlong_penalty: float = 1.0  # the penalty at the full length (max_new_tokens)
    mask_truncated: bool = False  # completions cut at max_new_tokens get no loss (DAPO)
    # truncated importance sampling: per-token loss x min(pi_old / pi_engine, tis_cap); 0 = off
    tis_cap: float = 0.0  # needs an engine reporting its sampler log-probs (rollout.engine=vllm)


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    eps: float = 1e-8
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_ratio: float = 0.0
    min_lr_ratio: float = 0.0
    max_grad_norm: float = 1.0  # 0 = no clipping
    micro_batch_size: int = 8  # sequences per forward/backward; the gradient does not depend on it
    # run each prompt once per micro-batch for all its completions (a GRPO group shares it):
    # same log-probs and gradient, fewer tokens through the model
    share_prompt: bool = True
    # Llama-family models: RMSNorm and SwiGLU that recompute their pointwise activations in
    # the backward, attention with native GQA: same gradient, ~40 % less activation memory
    lean_kernels: bool = True
    mini_batches: int = 1  # optimizer steps per pass over the batch
    ppo_epochs: int = 1  # passes over the batch; > 1 (or mini_batches > 1) makes updates off-policy


@dataclass
class TrainerConfig:
    steps: int = 20
    batch_size: int = 32  # completions per optimizer step; a multiple of rollout.n
    seed: int = 0
    eval_every: int = 0  # 0 = only before and after training
    save_every: int = 0  # 0 = only at the end
    log_samples: int = 4  # completions written to samples.jsonl per step
    output_dir: str = "runs"
    run_name: str = ""  # "" = a timestamp
    threads: int = 0  # torch intra-op threads; 0 = one per core
    progress: bool = True
    # "" = a new run; "auto" = continue output_dir/run_name from its newest checkpoint if it
    # has one (else start it); a run or checkpoint folder = continue from there
    resume: str = ""
    allow_config_change: list[str] = field(default_factory=list)  # keys a resume may change
    keep_last: int = 2  # checkpoints kept (oldest deleted first); 0 = all
    max_bad_steps: int = 5  # abort after this many steps in a row with a non-finite loss/grad


@dataclass
class WorkerPlacement:
    """Ray resources of one worker actor (each policy rank is one actor)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0  # may be fractional: 0.5 + 0.5 share one GPU
    resources: dict[str, float] = field(default_factory=dict)  # custom resources, e.g. {node_a: 1}


@dataclass
class PolicyPlacement(WorkerPlacement):
    ranks: int = 1  # data-parallel ranks (torch.distributed + FSDP2); > 1 needs mode=ray


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
    num_cpus: int = 0  # CPUs of the Ray instance a run starts itself (0 = all); not for address
    start_timeout: float = 180.0  # seconds for a worker actor to be scheduled and built
    call_timeout: float = 3600.0  # seconds for one remote call (a step, a sync, an eval chunk)
    # torch.distributed backend of the policy ranks; auto = nccl when the ranks have GPUs, else gloo
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    policy: PolicyPlacement = field(default_factory=PolicyPlacement)
    rollout: WorkerPlacement = field(default_factory=WorkerPlacement)


@dataclass
class WandbConfig:
    project: str = "reasonrl"
    entity: str = ""  # "" = your default entity
    name: str = ""  # "" = the run directory's name
    group: str = ""
    tags: list[str] = field(default_factory=list)
    # offline: no network, files under <run>/wandb/ (upload later with `wandb sync`)
    mode: Literal["offline", "online", "disabled"] = "offline"


@dataclass
class TrackingConfig:
    # metrics.jsonl and samples.jsonl are always written; console = the progress bar
    backends: list[Literal["console", "jsonl", "tensorboard", "wandb"]] = field(
        default_factory=lambda: ["console", "jsonl"])
    tensorboard_dir: str = ""  # "" = <run>/tensorboard
    wandb: WandbConfig = field(default_factory=WandbConfig)
    report: bool = True  # write <run>/report.html at the end of training


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Check `value` against the annotation `tp` and convert int->float; raise ConfigError."""
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
        return [_coerce(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
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
        return float(value)
    if tp is str:
        if value is None:
            return ""
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return str(value)
    raise TypeError(f"{path}: unsupported annotation {tp!r}")


def _build(cls: type, data: dict, path: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        full = f"{path}.{key}" if path else str(key)
        if key not in hints:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown config key {full!r}{hint}; allowed keys"
                              f"{' in ' + path if path else ''}: {', '.join(names)}")
        kwargs[key] = _coerce(value, hints[key], full)
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
    """Checks that need more than one key or a range; each error names its key."""
    from reasonrl.rewards import REWARD_COMPONENTS

    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ConfigError(msg)

    r, t, o, a, d = cfg.rollout, cfg.trainer, cfg.optim, cfg.algo, cfg.data
    need(r.n >= 1, f"rollout.n: must be >= 1, got {r.n}")
    need(a.advantage in ("raw", "reinforce_pp") or r.n >= 2,
         f"rollout.n: group advantages ({a.advantage}) need n >= 2 samples per prompt, got {r.n}; "
         "advantages that work with n = 1: raw, reinforce_pp")
    need(t.batch_size >= r.n and t.batch_size % r.n == 0,
         f"trainer.batch_size: {t.batch_size} completions do not divide into groups of "
         f"rollout.n={r.n}; use a multiple of {r.n}")
    need(t.steps >= 1, f"trainer.steps: must be >= 1, got {t.steps}")
    need(t.keep_last >= 0, f"trainer.keep_last: must be >= 0, got {t.keep_last}")
    need(t.max_bad_steps >= 1, f"trainer.max_bad_steps: must be >= 1, got {t.max_bad_steps}")
    need(r.max_new_tokens >= 1, f"rollout.max_new_tokens: must be >= 1, got {r.max_new_tokens}")
    need(d.max_prompt_tokens >= 1, f"data.max_prompt_tokens: must be >= 1, got {d.max_prompt_tokens}")
    need(r.temperature > 0, f"rollout.temperature: must be > 0, got {r.temperature}")
    need(0 < r.top_p <= 1, f"rollout.top_p: must be in (0, 1], got {r.top_p}")
    need(o.micro_batch_size >= 1, f"optim.micro_batch_size: must be >= 1, got {o.micro_batch_size}")
    need(o.lr >= 0, f"optim.lr: must be >= 0, got {o.lr}")
    need(len(o.betas) == 2, f"optim.betas: expected two numbers, got {o.betas}")
    need(0 <= o.warmup_ratio < 1, f"optim.warmup_ratio: must be in [0, 1), got {o.warmup_ratio}")
    need(0 <= o.min_lr_ratio <= 1, f"optim.min_lr_ratio: must be in [0, 1], got {o.min_lr_ratio}")
    need(a.clip_low >= 0 and a.clip_high >= 0, "algo.clip_low/clip_high: must be >= 0")
    need(a.beta >= 0, f"algo.beta: must be >= 0, got {a.beta}")
    need(a.std_eps >= 0, f"algo.std_eps: must be >= 0, got {a.std_eps}")
    need(a.clip_ratio_c == 0 or a.clip_ratio_c > 1,
         f"algo.clip_ratio_c: must be 0 (off) or > 1, got {a.clip_ratio_c}")
    need(not a.dynamic_sampling or r.n >= 2,
         f"algo.dynamic_sampling: needs rollout.n >= 2 (a group of one is always flat), got {r.n}")
    need(a.dynamic_sampling_tol >= 0,
         f"algo.dynamic_sampling_tol: must be >= 0, got {a.dynamic_sampling_tol}")
    need(a.max_resample >= 0, f"algo.max_resample: must be >= 0, got {a.max_resample}")
    need(0 <= a.overlong_buffer < r.max_new_tokens,
         f"algo.overlong_buffer: must be in [0, rollout.max_new_tokens={r.max_new_tokens}), "
         f"got {a.overlong_buffer}")
    need(a.overlong_penalty >= 0, f"algo.overlong_penalty: must be >= 0, got {a.overlong_penalty}")
    need(o.mini_batches >= 1, f"optim.mini_batches: must be >= 1, got {o.mini_batches}")
    need(o.mini_batches <= t.batch_size, f"optim.mini_batches: {o.mini_batches} is more than "
         f"trainer.batch_size={t.batch_size} completions")
    need(o.ppo_epochs >= 1, f"optim.ppo_epochs: must be >= 1, got {o.ppo_epochs}")
    from reasonrl.rollout import ENGINES_WITH_LOGPROBS, engine_problem

    need(a.tis_cap >= 0, f"algo.tis_cap: must be >= 0 (0 = off), got {a.tis_cap}")
    need(a.tis_cap == 0 or r.engine in ENGINES_WITH_LOGPROBS,
         f"algo.tis_cap: needs the sampler's log-probs, which rollout.engine={r.engine} does not "
         f"report; engines that do: {', '.join(ENGINES_WITH_LOGPROBS)}")
    v = r.vllm
    need(v.kv_cache_gib >= 0, f"rollout.vllm.kv_cache_gib: must be >= 0, got {v.kv_cache_gib}")
    need(0 < v.gpu_memory_utilization <= 1,
         f"rollout.vllm.gpu_memory_utilization: must be in (0, 1], got {v.gpu_memory_utilization}")
    need(v.max_model_len >= 0, f"rollout.vllm.max_model_len: must be >= 0, got {v.max_model_len}")
    need(v.threads >= 0, f"rollout.vllm.threads: must be >= 0, got {v.threads}")
    need(v.probe_every >= 0, f"rollout.vllm.probe_every: must be >= 0, got {v.probe_every}")
    need(v.probe_tol >= 0, f"rollout.vllm.probe_tol: must be >= 0 (0 = by dtype), got {v.probe_tol}")
    problem = engine_problem(r.engine)  # a missing extra fails now, not after loading the model
    need(problem is None, f"rollout.engine: {problem}")
    need(bool(cfg.reward.weights), "reward.weights: at least one component is needed")
    for name in cfg.reward.weights:
        need(name in REWARD_COMPONENTS, f"reward.weights.{name}: unknown reward component; "
             f"allowed: {', '.join(REWARD_COMPONENTS)}")
    rw = cfg.reward
    need(rw.timeout > 0, f"reward.timeout: must be > 0 seconds, got {rw.timeout}")
    need(rw.num_workers >= 1, f"reward.num_workers: must be >= 1, got {rw.num_workers}")
    need(0 <= rw.countdown_format_score <= 1,
         f"reward.countdown_format_score: must be in [0, 1], got {rw.countdown_format_score}")
    need(not rw.fn or (":" in rw.fn and all(rw.fn.rpartition(":")[::2])),
         f"reward.fn: expected module:function or path/file.py:function, got {rw.fn!r}")
    if d.task in ("file", "jsonl"):
        need(bool(d.train_path), f"data.train_path: required when data.task={d.task}")
    for key in d.fields:
        need(key in DATA_FIELDS, f"data.fields.{key}: unknown field; allowed: {', '.join(DATA_FIELDS)}")
    cd = d.countdown
    need(2 <= cd.min_numbers <= cd.max_numbers <= 6,
         "data.countdown: need 2 <= min_numbers <= max_numbers <= 6")
    need(1 <= cd.min_number <= cd.max_number, "data.countdown: need 1 <= min_number <= max_number")
    need(cd.min_target <= cd.max_target, "data.countdown: min_target > max_target")
    need(d.piecewise.train_variants >= 0 and d.piecewise.val_variants >= 0,
         "data.piecewise: train_variants and val_variants must be >= 0")
    ar = d.arithmetic
    need(ar.min_operand <= ar.max_operand, "data.arithmetic: min_operand > max_operand")
    need(ar.num_operands >= 2, "data.arithmetic.num_operands: must be >= 2")
    for op in ar.operators:
        need(op in ("+", "-", "*"), f"data.arithmetic.operators: {op!r} is not allowed; "
             "allowed values: +, -, *")
    lo, pl = cfg.model.lora, cfg.placement
    need(lo.rank >= 0, f"model.lora.rank: must be >= 0 (0 = off), got {lo.rank}")
    need(lo.alpha > 0, f"model.lora.alpha: must be > 0, got {lo.alpha}")
    need(0 <= lo.dropout < 1, f"model.lora.dropout: must be in [0, 1), got {lo.dropout}")
    need(lo.rank == 0 or bool(lo.target_modules), "model.lora.target_modules: at least one module name")
    need(pl.policy.ranks >= 1, f"placement.policy.ranks: must be >= 1, got {pl.policy.ranks}")
    need(pl.policy.ranks == 1 or pl.mode == "ray",
         f"placement.policy.ranks: {pl.policy.ranks} ranks need placement.mode=ray")
    need(pl.policy.ranks == 1 or lo.rank == 0,
         "placement.policy.ranks: data-parallel ranks train the full model; with model.lora.rank > 0 "
         "use one rank")
    need(pl.start_timeout > 0, f"placement.start_timeout: must be > 0 seconds, got {pl.start_timeout}")
    need(pl.call_timeout > 0, f"placement.call_timeout: must be > 0 seconds, got {pl.call_timeout}")
    need(pl.num_cpus >= 0, f"placement.num_cpus: must be >= 0 (0 = all), got {pl.num_cpus}")
    for role, w in (("policy", pl.policy), ("rollout", pl.rollout)):
        need(w.num_cpus >= 0 and w.num_gpus >= 0,
             f"placement.{role}: num_cpus and num_gpus must be >= 0, got {w.num_cpus}, {w.num_gpus}")
        need(w.num_gpus <= 1 or w.num_gpus == int(w.num_gpus),
             f"placement.{role}.num_gpus: a fraction must be < 1 (0.5 shares a GPU), got {w.num_gpus}")
        for name, amount in w.resources.items():
            need(amount > 0, f"placement.{role}.resources.{name}: must be > 0, got {amount}")
    for section in ("num_gpus", "resources"):
        need(pl.mode == "ray" or getattr(pl.policy, section) == getattr(WorkerPlacement(), section)
             and getattr(pl.rollout, section) == getattr(WorkerPlacement(), section),
             f"placement.policy/rollout.{section}: only used with placement.mode=ray")
    check_device(pl.device)
    need(pl.mode == "local" or pl.device == "auto",
         f"placement.device: {pl.device} is only used with placement.mode=local; in ray mode a worker "
         "is on a GPU when placement.<worker>.num_gpus > 0")
    need(pl.backend != "nccl" or pl.policy.num_gpus > 0,
         "placement.backend: nccl needs GPUs (placement.policy.num_gpus > 0)")
    import importlib.util

    need(pl.mode != "ray" or importlib.util.find_spec("ray") is not None,
         "placement.mode=ray needs Ray: pip install 'reasonrl[ray]'")
    need(lo.rank == 0 or importlib.util.find_spec("peft") is not None,
         "model.lora.rank > 0 needs peft: pip install 'reasonrl[lora]'")
    from reasonrl.tracking import missing_extra

    for backend in cfg.tracking.backends:  # a missing extra fails now, not after the first eval
        problem = missing_extra(backend)
        need(problem is None, f"tracking.backends: {problem}")


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
