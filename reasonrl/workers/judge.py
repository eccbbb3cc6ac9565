"""The judge role (reward.model): a frozen model with a batched no-grad forward, `score`, that
scores the `judge` and `classifier` components of reward.weights, and the model it loads (any
model.path form).

`RewardModelWorker` is a worker like the teacher: built by its `from_config` wherever its role is
placed (`placement.judge`: a process of its own in local placement, a Ray actor in ray
placement), never in the trainer's process, so the trainer can wait for it with a deadline and
kill and replace one that hangs (`reasonrl.placement`). Its scoring function has the batch form of
a reward function, called with the rows of one batch:

    fn(completions, ground_truths, groups, extra_infos, *, prompts, spec) -> one score per row

`spec` is reward.model as a dict with the kind and the device, `prompts` the examples' prompts.
A row's score is a float, or a string saying why it has none (`rewards.judging`). The function's
`warmup(spec)` loads the model when the worker is built, outside any call's timeout.

Loading: the path forms of model.path (`model.load.resolve_model_dir`: the embedded
SmolLM2-135M-Instruct for "", a folder, a `checkpoints/step_N` folder, a Hub id through the
offline cache) plus `tiny` (the random test model; as a classifier, the same architecture with
a random one-label head). A classifier must be a sequence-classification model with its score
head saved (a causal LM loaded as one would get a random head and score noise: refused), of one
or two labels. Precision `bf16` loads the weights in bf16 (the model only scores).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch

from reasonrl.config import resolve_device
from reasonrl.errors import ModelLoadError
from reasonrl.model.load import TINY, build_tiny_model, resolve_model_dir
from reasonrl.registry import REWARD_COMPONENTS
from reasonrl.rewards.judging import (
    RowScore,
    classifier_scores,
    classifier_text,
    first_token_ids,
    judge_text,
    number_scores,
    verdict_scores,
)

_LOADED: dict[str, tuple[Any, Any]] = {}  # what was loaded -> (model, tokenizer), in this worker


def _what(spec: dict) -> str:
    return "a sequence-classification reward model" if spec["kind"] == "classifier" else "a causal LM judge"


def _load(spec: dict, dtype: torch.dtype):
    """(model, tokenizer) of reward.model.path for `spec["kind"]`, on the CPU, in `dtype`."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    classifier = spec["kind"] == "classifier"
    if spec["path"] == TINY:
        model, tokenizer = build_tiny_model(seed=0)
        if classifier:
            config = model.config
            config.num_labels = 1
            with torch.random.fork_rng():
                torch.manual_seed(0)
                model = AutoModelForSequenceClassification.from_config(config)
        return model.to(dtype), tokenizer
    try:
        folder = resolve_model_dir(spec["path"], spec["revision"])
    except ModelLoadError as err:  # its messages name model.path / model.revision
        raise ModelLoadError(f"reward.{err}") from None
    auto = AutoModelForSequenceClassification if classifier else AutoModelForCausalLM
    try:
        model, info = auto.from_pretrained(str(folder), dtype=dtype, output_loading_info=True)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"reward.model.path={spec['path']}: cannot load {folder} as "
                             f"{_what(spec)}: {err}") from None
    if classifier and any(key.split(".")[0] in ("score", "classifier") for key in info["missing_keys"]):
        raise ModelLoadError(f"reward.model.path={spec['path']}: {folder} has no trained classification "
                             "head (its score weights are missing): it is not a sequence-classification "
                             "reward model. A causal LM scores as the judge (reward.weights: judge)")
    return model, tokenizer


def load_reward_model(spec: dict):
    """(model, tokenizer) of `spec`, loaded once per worker, in eval mode on its device."""
    key = json.dumps({k: spec[k] for k in ("kind", "path", "revision", "precision", "device")},
                     sort_keys=True)
    if key in _LOADED:
        return _LOADED[key]
    model, tokenizer = _load(spec, torch.bfloat16 if spec["precision"] == "bf16" else torch.float32)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if spec["kind"] == "classifier":
        labels = model.config.num_labels
        if labels not in (1, 2):
            raise ModelLoadError(f"reward.model.path={spec['path']}: a classifier of {labels} labels; a "
                                 "reward model has one (its logit is the reward) or two (P(label 1) is)")
        model.config.pad_token_id = tokenizer.pad_token_id  # its pooling finds each row's last token
    else:
        yes, no = (first_token_ids(tokenizer, word) for word in spec["verdicts"])
        if not yes or not no or set(yes) & set(no):
            raise ModelLoadError(f"reward.model.verdicts={spec['verdicts']}: they start with tokens {yes} "
                                 f"and {no} in this tokenizer, which must differ")
    model.requires_grad_(False)
    _LOADED[key] = (model.eval().to(resolve_device(spec["device"])), tokenizer)
    return _LOADED[key]


def warmup(spec: dict) -> None:
    """Load the model (called by the worker when it loads a scoring function)."""
    load_reward_model(spec)


@REWARD_COMPONENTS.register("judge", model=True)
def judge(completions: list[str], ground_truths: list[str], groups: list[int], extra_infos: list[dict], *,
          prompts: list, spec: dict) -> list[RowScore]:
    """a generative judge (reward.model): the rubric's verdict P(yes), or its number / max_score"""
    model, tokenizer = load_reward_model(spec)
    texts = [judge_text(tokenizer, spec["template"], p, c, g)
             for p, c, g in zip(prompts, completions, ground_truths, strict=True)]
    if spec["parse"] == "verdict":
        return verdict_scores(model, tokenizer, texts, *spec["verdicts"], spec["batch_size"])
    return number_scores(model, tokenizer, texts, spec["max_new_tokens"], spec["max_score"],
                         spec["batch_size"])


@REWARD_COMPONENTS.register("classifier", model=True)
def classifier(completions: list[str], ground_truths: list[str], groups: list[int],
               extra_infos: list[dict], *, prompts: list, spec: dict) -> list[RowScore]:
    """a sequence-classification reward model (reward.model) scoring prompt + completion"""
    model, tokenizer = load_reward_model(spec)
    texts = [classifier_text(tokenizer, p, c) for p, c in zip(prompts, completions, strict=True)]
    return classifier_scores(model, tokenizer, texts, spec["batch_size"])


judge.warmup = warmup  # type: ignore[attr-defined]
classifier.warmup = warmup  # type: ignore[attr-defined]


def judge_kind(cfg) -> str | None:
    """The component of reward.weights a judge role scores (`judge` or `classifier`), or None."""
    return next((k for k in cfg.reward.weights if k in REWARD_COMPONENTS
                 and REWARD_COMPONENTS[k].model), None)


class RewardModelWorker:
    """The judge role: reward.model loaded once, and `score`, one batch of rows through its
    scoring function (see the module docstring)."""

    def __init__(self, spec: dict, target: str | None = None):
        from reasonrl.rewards.verifiers import load_target

        self.spec = spec
        fn = REWARD_COMPONENTS.get(spec["kind"])
        self.fn = load_target(target) if target else fn
        warm = getattr(self.fn, "warmup", None)
        if warm is not None:
            warm(spec)  # the model loaded now, within the role's load timeout

    @classmethod
    def from_config(cls, cfg, host, target: str | None = None) -> RewardModelWorker:
        """reward.model for the component reward.weights names, on `host.device`; `target`
        ("module:function" or "file.py:function"): a scoring function of that batch form in
        place of the component's own (a test's scripted judge)."""
        spec = {"kind": judge_kind(cfg), **dataclasses.asdict(cfg.reward.model), "device": str(host.device)}
        return cls(spec, target)

    @torch.no_grad()
    def score(self, prompts: list, completions: list[str], ground_truths: list[str]) -> list[RowScore]:
        """One score per row (a float, or a string saying why the row has none)."""
        n = len(completions)
        return list(self.fn(completions, ground_truths, list(range(n)), [{} for _ in range(n)],
                            prompts=prompts, spec=self.spec))

    def close(self) -> None:
        """Nothing to free beyond the process's own memory."""
