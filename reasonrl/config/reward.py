"""The `reward` section: how a completion is scored (verifiers, reward functions and their
styles, worker processes and their bounds, the task rules) and `reward.model`, the judge or
classifier behind the `judge` / `classifier` components (docs/judges.md). Re-exported by
reasonrl.config.schema and reasonrl.config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from reasonrl.config.fields import param
from reasonrl.registry import COUNTDOWN_SCORING, MATH_SCORING, PIECEWISE_SCORING, REWARD_COMPONENTS, VERIFIERS

DEFAULT_JUDGE_TEMPLATE = (
    "Question: {question}\n\nReference answer: {ground_truth}\n\nResponse: {completion}\n\n"
    "Is the response's final answer equal to the reference answer? Answer Yes or No."
)


@dataclass
class RewardModelConfig:
    """The model behind the `judge` and `classifier` components of reward.weights (docs/judges.md):
    judge = a causal LM asked `template`, its answer parsed to a score; classifier = a
    sequence-classification reward model scoring prompt + completion in its chat template."""

    # any model.path form: "" = the embedded SmolLM2-135M-Instruct, tiny, a folder, a Hub id, a checkpoint
    path: str = ""
    revision: str = ""
    # judge: its user message; {question}, {completion} and {ground_truth} are filled in
    template: str = DEFAULT_JUDGE_TEMPLATE
    # judge: verdict = P(yes) / (P(yes) + P(no)) of its first answer token (one forward); number = the
    # first number of a greedy answer of max_new_tokens tokens, divided by max_score
    parse: Literal["verdict", "number"] = "verdict"
    verdicts: list[str] = param(["Yes", "No"])  # parse=verdict: the yes and the no word (quoted in YAML)
    max_new_tokens: int = param(8, ge=1)
    max_score: float = param(10.0, gt=0)
    batch_size: int = param(8, ge=1)  # completions per forward (and per call of the reward-model worker)
    timeout: float = param(120.0, gt=0)  # seconds per batch; a batch past it scores 0 and is counted
    load_timeout: float = param(600.0, gt=0)  # seconds to load the model in its worker
    precision: Literal["fp32", "bf16"] = "fp32"  # it only scores: bf16 where the run computes in bf16
    # where it runs is the judge role's: placement.judge (a process of its own in local placement, on
    # placement.device; a Ray actor with placement.judge's resources in ray placement)


@dataclass
class RewardConfig:
    # weighted sum of named components (the REWARD_COMPONENTS registry, reasonrl.rewards.components)
    # (and the names of reward.fns)
    weights: dict[str, float] = param({"correct": 1.0}, keys=REWARD_COMPONENTS, noun="reward component",
                                      also_keys="fns")
    fallback_last_number: bool = True  # no \boxed / <answer>: take the last number
    # which verifier scores `correct`: auto = from each example's data_source (README, "Tasks")
    task: str = param("auto", choices=VERIFIERS, also=("auto",))
    fn: str = ""  # custom verifier for `correct`, "module:function" or "file.py:function"
    # reward functions beside `correct`, name -> "module:function": each the component of its name,
    # weighted in reward.weights (TRL's reward_funcs and reward_weights; docs/reward-functions.md)
    fns: dict[str, str] = param({})
    # how reward.fn and reward.fns are called: auto = told by each function's parameter names, passed by
    # name; reasonrl = f(completion, ground_truth, extra_info); reasonrl_batch = f(completions,
    # ground_truths, groups, extra_infos); trl = TRL's reward_funcs; verl = verl's compute_score;
    # openrlhf = OpenRLHF's reward_func (docs/reward-functions.md)
    fn_style: Literal["auto", "reasonrl", "reasonrl_batch", "trl", "verl", "openrlhf"] = "auto"
    # extra keyword arguments of reward.fn, reward.fns and reward.batch_fn (verl's reward_kwargs)
    fn_kwargs: dict[str, Any] = param({})
    isolate_fn: bool = True  # run reward.fn in a worker process, with reward.timeout
    timeout: float = param(5.0, gt=0)  # seconds per sample for out-of-process verifiers (math, reward.fn)
    num_workers: int = param(2, ge=1)  # reward worker processes
    # memory of each reward worker process (MB, its interpreter and imports included, ~0.3 GB): a call
    # past it scores 0 as "out of memory" (reward/errors); 0 = no bound. Not reward.model's worker
    max_memory_mb: int = param(2048, ge=0, zero="no bound")
    countdown_format_score: float = param(0.1, ge=0, le=1)  # countdown: an equation was given but is wrong
    # countdown scoring (COUNTDOWN_SCORING): subset = each number at most once, format_score for a
    # well-formed wrong equation; tinyzero = each number exactly once, format_score for any answer
    countdown_rule: str = param("subset", choices=COUNTDOWN_SCORING)
    # countdown_rule=tinyzero: the prompt's end TinyZero reads with the response (rewards/tinyzero.py):
    # qwen-instruct = "<|im_start|>assistant" (ChatML chat templates); base = TinyZero's "Assistant:" frame
    tinyzero_template: Literal["qwen-instruct", "base"] = "qwen-instruct"
    # verl_gsm8k (data_source openai/gsm8k): verl's extract_solution method; strict = the last "#### N"
    # of the last 300 characters (verl's default), flexible = the last number there
    verl_gsm8k_method: Literal["strict", "flexible"] = "strict"
    # piecewise scoring (PIECEWISE_SCORING): partial_credit = reasonrl's checked equations;
    # transparent_grpo = Transparent GRPO's regex credits (the canonical problem only)
    piecewise_rule: str = param("partial_credit", choices=PIECEWISE_SCORING)
    # math scoring (MATH_SCORING): extracted = reasonrl's (\boxed{} > <answer> > last number, then
    # math-verify); reason_rl / easyrl / trl = those systems' own math-verify rewards, as written there
    math_rule: str = param("extracted", choices=MATH_SCORING)
    # custom batch reward for `correct`, "module:function": called once per rollout batch with all
    # completions, ground truths, group indices and extra_infos (README, "Custom rewards")
    batch_fn: str = ""
    # how components combine: sum = the weighted sum; all = the weighted sum if every weighted
    # component scores > 0, else 0; gdpo = each component normalised within its prompt's group,
    # then the weighted sum (GDPO, docs/algorithms.md). gate: components that must score > 0 for
    # the sum to count (gdpo: for any component to count)
    combine: Literal["sum", "all", "gdpo"] = "sum"
    gate: list[str] = param([], keys=REWARD_COMPONENTS, noun="reward component", also_keys="fns")
    model: RewardModelConfig = field(default_factory=RewardModelConfig)  # the judge / classifier
