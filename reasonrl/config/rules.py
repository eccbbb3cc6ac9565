"""The config's rules that involve several keys (each field's own check is its `param` in
`schema.py`), grouped by the section whose key an error names: the key to change. `validate`
runs them all at load time, section by section in the config's order.

A rule about the rollout engine asks the engine's `ENGINES` entry (`tensor_parallel`,
`max_model_len`, filled in `reasonrl.rollout.engines`), found through the registry below the
config, never by comparing `rollout.engine` to a name. Checks that need more than the config
(is an extra installed, can Ray place the workers, does the model's context fit: `check_context`
with the model's positions) are the preflight of `reasonrl.placement`, run before any model loads.
"""

from __future__ import annotations

import dataclasses
import re
import string

from reasonrl.config.agent import agent_rules
from reasonrl.config.openenv import openenv_rules
from reasonrl.config.placement import PolicyPlacement, WorkerPlacement
from reasonrl.config.reasoning_gym import reasoning_gym_rules
from reasonrl.config.reward import RewardConfig, RewardModelConfig
from reasonrl.config.schema import (
    AlgoConfig,
    Config,
    CriticConfig,
    EnvConfig,
    TeacherConfig,
)
from reasonrl.config.verifiers_tasks import verifiers_rules
from reasonrl.errors import ConfigError
from reasonrl.registry import (
    ADVANTAGES,
    DATA_TASKS,
    ENGINES,
    IMPORTANCE_CORRECTIONS,
    REWARD_COMPONENTS,
    needs_critic,
)

MIN_REWARD_MEMORY_MB = 512  # reward.max_memory_mb's least bound (0 aside)
# reward/<name> metrics a step logs of its own (train/step_metrics.py, source/collect.py): no
# reward.fns name may take one
REWARD_METRICS = ("mean", "std", "errors", "timeouts", "zero_std_groups", "accuracy", "unscored", "env",
                  "overlong_penalty", "mean_before_filter")


def need(ok: bool, msg: str) -> None:
    """A rule: ConfigError(msg) unless `ok`."""
    if not ok:
        raise ConfigError(msg)


def model_rules(cfg: Config) -> None:
    lo = cfg.model.lora
    need(lo.rank == 0 or bool(lo.target_modules), "model.lora.target_modules: at least one module name")


def data_rules(cfg: Config) -> None:
    d = cfg.data
    if not DATA_TASKS[d.task].generated:
        need(bool(d.train_path), f"data.train_path: required when data.task={d.task}")
    cd, ar = d.countdown, d.arithmetic
    need(cd.min_numbers <= cd.max_numbers, "data.countdown: need 2 <= min_numbers <= max_numbers <= 6")
    need(cd.min_number <= cd.max_number, "data.countdown: need 1 <= min_number <= max_number")
    need(cd.min_target <= cd.max_target, "data.countdown: min_target > max_target")
    need(ar.min_operand <= ar.max_operand, "data.arithmetic: min_operand > max_operand")
    reasoning_gym_rules(d.task, d.train_path, d.val_path, d.reasoning_gym)
    verifiers_rules(d.task, d.verifiers, cfg.reward.task, cfg.reward.fn or cfg.reward.batch_fn,
                    cfg.env.format, cfg.env.fn)


def rollout_rules(cfg: Config) -> None:
    r, a, pl = cfg.rollout, cfg.algo, cfg.placement
    singles = ", ".join(e.name for e in ADVANTAGES if not e.needs_groups)
    need(not ADVANTAGES[a.advantage].needs_groups or r.n >= 2,
         f"rollout.n: group advantages ({a.advantage}) need n >= 2 samples per prompt, got {r.n}; "
         f"advantages that work with n = 1: {singles}")
    tp = r.vllm.tensor_parallel_size
    need(tp == 1 or ENGINES[r.engine].tensor_parallel,
         f"rollout.vllm.tensor_parallel_size: {tp} is vLLM's; rollout.engine={r.engine} runs on one device")
    need(tp == 1 or pl.mode == "local" or pl.rollout.num_gpus == tp,
         f"rollout.vllm.tensor_parallel_size: {tp} GPUs per engine need placement.rollout.num_gpus={tp} "
         f"(each rollout replica's actor must see {tp} GPUs), got {pl.rollout.num_gpus:g}")
    need(r.threads == 0 or cfg.trainer.max_staleness > 0,
         f"rollout.threads: {r.threads} threads of the rollout process, which only asynchronous training "
         "runs (trainer.max_staleness > 0); with trainer.max_staleness=0 the rollout runs in the trainer's "
         "process on trainer.threads: remove rollout.threads or set trainer.max_staleness")


def env_rules(cfg: Config) -> None:
    """Multi-turn episodes."""
    e, r = cfg.env, cfg.rollout
    if e.fn:
        if e.name != "none":
            raise ConfigError(f"env.fn and env.name: set one (env.fn={e.fn!r} replaces the built-in "
                              f"env.name={e.name!r})")
        if ":" not in e.fn or not all(e.fn.rpartition(":")[::2]):
            raise ConfigError(f"env.fn: expected module:Class or path/file.py:Class, got {e.fn!r}")
    elif e.format != "auto" and e.name != "none":
        raise ConfigError(f"env.format: {e.format} is the style of an env.fn class; env.name={e.name} is "
                          "built in: remove env.format or set env.fn instead of env.name")
    openenv_rules(e.name, e.fn, e.format, e.url, e.openenv)
    a = cfg.algo
    agent_rules(e.fn, e.format, e.name, e.agent, cfg.trainer.max_staleness,
                a.advantage if needs_critic(a.advantage) else "", a.gamma, a.beta > 0 and a.kl_in == "reward")
    if e.name == "none" and not e.fn and e.format != "agent":
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
    group = max(r.n, cfg.eval.n)
    if 0 < e.max_concurrent_episodes < group:
        raise ConfigError(f"env.max_concurrent_episodes: {e.max_concurrent_episodes} is fewer than the "
                          f"samples of one prompt (rollout.n={r.n}, eval.n={cfg.eval.n}), which start "
                          f"together; use at least {group}")
    if e.max_turn_tokens > r.max_new_tokens:
        raise ConfigError(f"env.max_turn_tokens: {e.max_turn_tokens} is more than rollout.max_new_tokens="
                          f"{r.max_new_tokens}, which counts every model token of an episode; use at most "
                          "that")
    if e.max_total_tokens and e.max_total_tokens < min(e.max_turn_tokens or r.max_new_tokens,
                                                       r.max_new_tokens):
        raise ConfigError(f"env.max_total_tokens: {e.max_total_tokens} is less than one model turn "
                          f"({e.max_turn_tokens or r.max_new_tokens} tokens); raise it or lower "
                          "env.max_turn_tokens")


def reward_rules(cfg: Config) -> None:
    rw, d = cfg.reward, cfg.data
    need(bool(rw.weights), "reward.weights: at least one component is needed")
    for g in rw.gate:
        need(g in rw.weights, f"reward.gate: {g!r} is not in reward.weights, so it is not computed; add it "
             "there (weight 0 gates without adding to the sum)")
    need(rw.combine != "gdpo" or cfg.rollout.n >= 2,
         f"reward.combine=gdpo: normalises each component within a prompt's group, which needs "
         f"rollout.n >= 2 samples per prompt, got {cfg.rollout.n}")
    need(not (rw.fn and rw.batch_fn), "reward.fn and reward.batch_fn: set one (both replace `correct`)")
    need(not rw.batch_fn or (":" in rw.batch_fn and all(rw.batch_fn.rpartition(":")[::2])),
         f"reward.batch_fn: expected module:function or path/file.py:function, got {rw.batch_fn!r}")
    need(rw.piecewise_rule != "transparent_grpo" or d.task != "piecewise"
         or d.piecewise.train_variants == d.piecewise.val_variants == 0,
         "reward.piecewise_rule=transparent_grpo scores the canonical problem only: set "
         "data.piecewise.train_variants=0 and data.piecewise.val_variants=0")
    need(not rw.fn or (":" in rw.fn and all(rw.fn.rpartition(":")[::2])),
         f"reward.fn: expected module:function or path/file.py:function, got {rw.fn!r}")
    # a reward worker's interpreter and imports (torch among them) take ~0.3 GB before any call
    need(rw.max_memory_mb == 0 or rw.max_memory_mb >= MIN_REWARD_MEMORY_MB,
         f"reward.max_memory_mb: {rw.max_memory_mb} MB is too little for a reward worker, whose interpreter "
         f"and imports take ~300 MB before the reward function runs: give >= {MIN_REWARD_MEMORY_MB}, or 0 "
         "for no bound")
    reward_fn_rules(rw)
    reward_model_rules(cfg)


def reward_fn_rules(rw: RewardConfig) -> None:
    """reward.fns: names apart from the built-in components, each a target and weighted;
    reward.batch_fn is reasonrl's batch form; reward.fn_kwargs needs a function to go to."""
    for name, target in rw.fns.items():
        need(name not in REWARD_COMPONENTS, f"reward.fns.{name}: {name!r} is a built-in reward component; "
             "give the function another name")
        need(name not in REWARD_METRICS and re.fullmatch(r"[A-Za-z_][\w-]*", name) is not None,
             f"reward.fns.{name}: its metric would be reward/{name}, " + (
                 "which the step logs already" if name in REWARD_METRICS else "not a plain name")
             + "; give the function another name (letters, digits, _ and -)")
        need(":" in str(target) and all(str(target).rpartition(":")[::2]),
             f"reward.fns.{name}: expected module:function or path/file.py:function, got {target!r}")
        need(name in rw.weights, f"reward.fns.{name}: not in reward.weights, so it is not computed; add "
             f"reward.weights.{name} (TRL's reward_weights default to 1.0 each)")
    need(not rw.batch_fn or rw.fn_style in ("auto", "reasonrl_batch"),
         f"reward.batch_fn: reasonrl's batch form, but reward.fn_style={rw.fn_style}; give a function of "
         "another style as reward.fn")
    need(not rw.fn_kwargs or bool(rw.fn or rw.fns or rw.batch_fn),
         "reward.fn_kwargs: set, but there is no reward.fn, reward.fns or reward.batch_fn to pass them to")


def reward_model_rules(cfg: Config) -> None:
    """reward.model: set only when reward.weights names the one component it scores (`judge` or
    `classifier`); a template with known fields; two distinct verdicts."""
    rw, m, default = cfg.reward, cfg.reward.model, RewardModelConfig()
    models = [k for k in rw.weights if k in REWARD_COMPONENTS and REWARD_COMPONENTS[k].model]
    if not models:
        changed = [f"reward.model.{f.name}" for f in dataclasses.fields(m)
                   if getattr(m, f.name) != getattr(default, f.name)]
        changed += [f"placement.judge.{k}" for k, v in dataclasses.asdict(cfg.placement.judge).items()
                    if v != getattr(WorkerPlacement(), k)]
        need(not changed, f"{', '.join(changed)}: set, but reward.weights names neither `judge` nor "
             "`classifier`, the components reward.model scores; add one (docs/judges.md), or remove them")
        return
    need(len(models) == 1, f"reward.weights: {' and '.join(models)} are both scored by reward.model, one "
         "model; keep one")
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(m.template) if name is not None}
    except ValueError as err:
        raise ConfigError(f"reward.model.template: {err} (a literal brace is written {{{{ or }}}})") from None
    unknown = sorted(fields - {"question", "completion", "ground_truth"})
    need(not unknown, f"reward.model.template: unknown field(s) {unknown}; it may use {{question}}, "
         "{completion} and {ground_truth}")
    need(len(m.verdicts) == 2 and all(v.strip() for v in m.verdicts) and m.verdicts[0] != m.verdicts[1],
         f"reward.model.verdicts: two different words are needed, for yes and for no, got {m.verdicts}")


def algo_rules(cfg: Config) -> None:
    a, r = cfg.algo, cfg.rollout
    need(a.clip_ratio_c == 0 or a.clip_ratio_c > 1,
         f"algo.clip_ratio_c: must be 0 (off) or > 1, got {a.clip_ratio_c}")
    need(not a.dynamic_sampling or r.n >= 2,
         f"algo.dynamic_sampling: needs rollout.n >= 2 (a group of one is always flat), got {r.n}")
    need(a.overlong_buffer < r.max_new_tokens,
         f"algo.overlong_buffer: must be in [0, rollout.max_new_tokens={r.max_new_tokens}), "
         f"got {a.overlong_buffer}")
    with_logprobs = [e.name for e in ENGINES if e.logprobs]
    need(IMPORTANCE_CORRECTIONS[a.importance_correction].off or r.engine in with_logprobs,
         f"algo.importance_correction={a.importance_correction}: needs the sampler's log-probs, which "
         f"rollout.engine={r.engine} does not report; engines that do: {', '.join(with_logprobs) or 'none'}")
    need(a.importance_correction != "mis" or a.importance_floor < a.importance_cap,
         f"algo.importance_floor: must be < algo.importance_cap={a.importance_cap} (mis keeps "
         f"floor <= rho <= cap), got {a.importance_floor}")
    need(needs_critic(a.advantage) or (a.gamma, a.lam) == (1.0, 1.0),
         f"algo.gamma/algo.lam: only used by critic estimators (GAE); algo.advantage={a.advantage} has none")
    loss_fn_rules(a)


def loss_fn_rules(a: AlgoConfig) -> None:
    """An out-of-tree policy loss (`algo.loss_fn`, loaded and its signature checked when the policy
    worker is built: `reasonrl.workers.policy.policy_loss_fn`) replaces `algo.policy_loss`, and
    `algo.loss_kwargs` are its alone."""
    if not a.loss_fn:
        need(not a.loss_kwargs, f"algo.loss_kwargs: {sorted(a.loss_kwargs)} are keyword arguments of an "
             "out-of-tree loss (algo.loss_fn), which is not set; a built-in loss reads its hyper-parameters "
             "from algo.* keys")
        return
    need(":" in a.loss_fn and all(a.loss_fn.rpartition(":")[::2]),
         f"algo.loss_fn: expected module:function or path/file.py:function, got {a.loss_fn!r}")
    need(a.policy_loss == AlgoConfig.policy_loss,
         f"algo.loss_fn and algo.policy_loss: set one (algo.loss_fn={a.loss_fn!r} replaces the built-in "
         f"algo.policy_loss={a.policy_loss!r})")


def optim_rules(cfg: Config) -> None:
    o, t = cfg.optim, cfg.trainer
    need(len(o.betas) == 2, f"optim.betas: expected two numbers, got {o.betas}")
    need(o.mini_batches <= t.batch_size, f"optim.mini_batches: {o.mini_batches} is more than "
         f"trainer.batch_size={t.batch_size} completions")
    decay_rule("optim", o.lr, o.weight_decay)


def decay_rule(section: str, lr: float, weight_decay: float) -> None:
    """AdamW scales each weight by 1 - lr x weight_decay a step (decoupled weight decay,
    Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", Algorithm 2): at 1 or more
    the weights flip sign or grow each step until they are no longer finite."""
    need(lr * weight_decay < 1, f"{section}.weight_decay: {weight_decay:g} x {section}.lr={lr:g} = "
         f"{lr * weight_decay:g}, must be below 1 (AdamW scales each weight by 1 - lr x weight_decay a "
         f"step; weight decay is usually 0 to 0.1)")


def eval_rules(cfg: Config) -> None:
    ev = cfg.eval
    need(ev.temperature > 0 or ev.n == 1,
         f"eval.n: greedy evaluation (eval.temperature=0) gives n identical samples; use eval.n=1 or "
         f"eval.temperature > 0, got n={ev.n}")
    for k in ev.k:
        need(1 <= k <= ev.n, f"eval.k: pass@{k} needs 1 <= k <= eval.n={ev.n}")


def critic_rules(cfg: Config) -> None:
    """The critic's settings (critic.*, placement.critic.*) only with an estimator that has one."""
    a, pl = cfg.algo, cfg.placement
    if needs_critic(a.advantage):
        decay_rule("critic", cfg.critic.lr, cfg.critic.weight_decay)
        return
    changed = [f"critic.{f.name}" for f in dataclasses.fields(CriticConfig)
               if getattr(cfg.critic, f.name) != getattr(CriticConfig(), f.name)]
    changed += [f"placement.critic.{k}" for k, v in dataclasses.asdict(pl.critic).items()
                if v != getattr(PolicyPlacement(), k)]
    critics = ", ".join(e.name for e in ADVANTAGES if needs_critic(e.name))
    need(not changed, f"{', '.join(changed)}: set, but algo.advantage={a.advantage} uses no critic; "
         f"estimators with a critic: {critics} (or remove the critic settings)")


def teacher_rules(cfg: Config) -> None:
    """The teacher's settings (teacher.*, placement.teacher.*) only with a teacher (teacher.path)."""
    if cfg.teacher.path:
        return
    changed = [f"teacher.{f.name}" for f in dataclasses.fields(TeacherConfig)
               if getattr(cfg.teacher, f.name) != getattr(TeacherConfig(), f.name)]
    changed += [f"placement.teacher.{k}" for k, v in dataclasses.asdict(cfg.placement.teacher).items()
                if v != getattr(WorkerPlacement(), k)]
    need(not changed, f"{', '.join(changed)}: set, but teacher.path is empty (no teacher); set teacher.path "
         "to distill from a teacher (docs/teachers.md), or remove them")


def trainer_rules(cfg: Config) -> None:
    t, r = cfg.trainer, cfg.rollout
    need(t.batch_size >= r.n and t.batch_size % r.n == 0,
         f"trainer.batch_size: {t.batch_size} completions do not divide into groups of "
         f"rollout.n={r.n}; use a multiple of {r.n}")


def placement_rules(cfg: Config) -> None:
    pl = cfg.placement
    for role, what in (("policy", "ranks"), ("critic", "ranks"), ("rollout", "replicas")):
        count = getattr(getattr(pl, role), what)
        need(count == 1 or pl.mode == "ray",
             f"placement.{role}.{what}: {count} {what} need placement.mode=ray")
    for role in ("policy", "critic"):
        w = getattr(pl, role)
        for key, default in (("reshard_after_forward", True), ("cpu_offload", False)):
            need(getattr(w, key) == default or w.ranks > 1,
                 f"placement.{role}.{key}: applies to FSDP2 ranks; set placement.{role}.ranks > 1 "
                 f"(it is {w.ranks})")
    for role, w in (("policy", pl.policy), ("rollout", pl.rollout), ("critic", pl.critic),
                    ("teacher", pl.teacher)):
        need(w.num_gpus <= 1 or w.num_gpus == int(w.num_gpus),
             f"placement.{role}.num_gpus: a fraction must be < 1 (0.5 shares a GPU), got {w.num_gpus}")
        for name, amount in w.resources.items():
            need(amount > 0, f"placement.{role}.resources.{name}: must be > 0, got {amount}")
    for section in ("num_gpus", "resources"):
        need(pl.mode == "ray" or getattr(pl.policy, section) == getattr(WorkerPlacement(), section)
             and getattr(pl.rollout, section) == getattr(WorkerPlacement(), section)
             and getattr(pl.critic, section) == getattr(WorkerPlacement(), section)
             and getattr(pl.teacher, section) == getattr(WorkerPlacement(), section),
             f"placement.policy/rollout/critic/teacher.{section}: only used with placement.mode=ray")
    check_device(pl.device)
    need(pl.mode == "local" or pl.device == "auto",
         f"placement.device: {pl.device} is only used with placement.mode=local; in ray mode a worker "
         "is on a GPU when placement.<worker>.num_gpus > 0")
    need(pl.backend != "nccl" or pl.policy.num_gpus > 0,
         "placement.backend: nccl needs GPUs (placement.policy.num_gpus > 0)")


# in the order of the config's sections (`Config`)
def sft_rules(cfg: Config) -> None:
    """`reasonrl sft`'s section: records come from files or from the task's solver, not both."""
    s = cfg.sft
    need(s.source == "files" or not (s.train_path or s.val_path),
         f"sft.train_path / sft.val_path: read only with sft.source=files; sft.source={s.source} writes "
         "its own records from data.task's problems: leave them empty, or set sft.source=files")


RULES = (model_rules, data_rules, rollout_rules, env_rules, reward_rules, algo_rules, optim_rules,
         eval_rules, critic_rules, teacher_rules, trainer_rules, placement_rules, sft_rules)


def validate(cfg: Config) -> None:
    """Every rule across keys (`RULES`); the first broken one raises a ConfigError naming the
    key to change."""
    for rules in RULES:
        rules(cfg)


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
    engine_limit, key = ENGINES[r.engine].max_model_len(r)  # an engine's own limit, if set lower
    if 0 < engine_limit < positions:
        limit, what = engine_limit, f"{key}={engine_limit} ({what})"
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
