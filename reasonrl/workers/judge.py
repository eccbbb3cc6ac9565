"""The judge role (reward.model): a frozen model, the kind of worker the teacher and the reference
are (`reasonrl.workers.frozen.FrozenModel`), whose batched no-grad forward scores the `judge` and
`classifier` components of reward.weights (`score`), and for a causal judge also gives token
log-probs (`logprobs`, as the teacher's).

`RewardModelWorker` is built by its `from_config` wherever its role is placed (`placement.judge`:
a process of its own in local placement, a Ray actor in ray placement), never in the trainer's
process, so the trainer can wait for it with a deadline and kill and replace one that hangs
(`reasonrl.placement`). `from_config` loads the model once, within the role's load timeout, and
the worker holds it (frozen: no gradient, eval mode, on the role's device); a replaced worker
loads it again. `score` calls the component's scoring function, a reward function's batch form
given the worker's model:

    fn(completions, ground_truths, groups, extra_infos, *, prompts, spec, model, tokenizer)
        -> one score per row

`spec` is reward.model as a dict with the kind and the device, `prompts` the examples' prompts.
A row's score is a float, or a string saying why it has none (`rewards.judging`).

Loading: `reasonrl.model.load`, as the teacher's and the policy's models load, with the path forms
of model.path (`resolve_model_dir`: the embedded SmolLM2-135M-Instruct for "", a folder, a
`checkpoints/step_N` folder, a Hub id through the offline cache; `tiny`: the random test model,
as a classifier the same architecture with a random one-label head). A judge is a causal LM
(`load_model_and_tokenizer`); a classifier a sequence-classification model
(`load_classifier_and_tokenizer`) with its score head saved (a causal LM loaded as one would get a
random head and score noise: refused), of one or two labels. Precision `bf16` loads the weights
in bf16 (the model only scores).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from reasonrl.config import resolve_device
from reasonrl.errors import ModelLoadError
from reasonrl.model.budget import token_budget
from reasonrl.model.forward import make_micro_batches
from reasonrl.model.load import (
    TINY,
    NoClassificationHead,
    load_classifier_and_tokenizer,
    load_model_and_tokenizer,
    local_model_folder,
)
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
from reasonrl.workers.frozen import FrozenModel


def judge_model(spec: dict):
    """(model, tokenizer) of reward.model (`spec`) for its kind, on its device, in the dtype its
    precision says; ModelLoadError (naming reward.model.*) when it cannot load or cannot score as
    that kind (a classifier without a trained head, or of another number of labels; verdicts that
    start with the same token)."""
    classifier = spec["kind"] == "classifier"
    dtype = torch.bfloat16 if spec["precision"] == "bf16" else torch.float32
    load = load_classifier_and_tokenizer if classifier else load_model_and_tokenizer
    try:
        model, tokenizer = load(spec["path"], dtype, seed=0, revision=spec["revision"])
    except NoClassificationHead as err:
        raise ModelLoadError(f"reward.{err}. A causal LM scores as the judge (reward.weights: judge)"
                             ) from None
    except ModelLoadError as err:  # its messages name model.path / model.revision
        raise ModelLoadError(f"reward.{err}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if classifier:
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
    return model.to(resolve_device(spec["device"])), tokenizer


@REWARD_COMPONENTS.register("judge", model=True)
def judge(completions: list[str], ground_truths: list[str], groups: list[int], extra_infos: list[dict], *,
          prompts: list, spec: dict, model, tokenizer) -> list[RowScore]:
    """a generative judge (reward.model): the rubric's verdict P(yes), or its number / max_score"""
    texts = [judge_text(tokenizer, spec["template"], p, c, g)
             for p, c, g in zip(prompts, completions, ground_truths, strict=True)]
    if spec["parse"] == "verdict":
        return verdict_scores(model, tokenizer, texts, *spec["verdicts"], spec["batch_size"])
    return number_scores(model, tokenizer, texts, spec["max_new_tokens"], spec["max_score"],
                         spec["batch_size"])


@REWARD_COMPONENTS.register("classifier", model=True)
def classifier(completions: list[str], ground_truths: list[str], groups: list[int],
               extra_infos: list[dict], *, prompts: list, spec: dict, model, tokenizer) -> list[RowScore]:
    """a sequence-classification reward model (reward.model) scoring prompt + completion"""
    texts = [classifier_text(tokenizer, p, c) for p, c in zip(prompts, completions, strict=True)]
    return classifier_scores(model, tokenizer, texts, spec["batch_size"])


def judge_kind(cfg) -> str | None:
    """The component of reward.weights a judge role scores (`judge` or `classifier`), or None."""
    return next((k for k in cfg.reward.weights if k in REWARD_COMPONENTS
                 and REWARD_COMPONENTS[k].model), None)


class RewardModelWorker(FrozenModel):
    """The judge role: reward.model, loaded once by `from_config` and held frozen; `score`, one
    batch of rows through its scoring function, and (a causal judge) `logprobs` (see the module
    docstring)."""

    def __init__(self, model, tokenizer, spec: dict, fn=None):
        model.requires_grad_(False)
        model.eval()
        self.tokenizer, self.spec = tokenizer, spec
        self.fn = fn if fn is not None else REWARD_COMPONENTS.get(spec["kind"])
        device = next(model.parameters()).device
        max_tokens = token_budget(model, device, 0)
        layout = functools.partial(_layout, spec["batch_size"], tokenizer.pad_token_id, max_tokens)
        super().__init__(model, layout, device)

    @staticmethod
    def check(cfg) -> None:
        """The preflight's check of reward.model.path, before any model loads: a local folder
        exists and holds config.json. An asynchronous local run builds its judge in the rollout
        process at the first step; a wrong path still fails at start-up, in one line. The
        default model, `tiny` and a Hub id are resolved when the worker loads them."""
        path = cfg.reward.model.path
        if path and path != TINY:
            local_model_folder(path, key="reward.model.path")

    @classmethod
    def from_config(cls, cfg, host, target: str | None = None) -> RewardModelWorker:
        """reward.model for the component reward.weights names, loaded on `host.device`; `target`
        ("module:function" or "file.py:function"): a scoring function of that batch form in
        place of the component's own, given the same model (a test's scripted judge)."""
        from reasonrl.rewards.verifiers import load_target

        spec = {"kind": judge_kind(cfg), **dataclasses.asdict(cfg.reward.model), "device": str(host.device)}
        model, tokenizer = judge_model(spec)
        return cls(model, tokenizer, spec, load_target(target) if target else None)

    @torch.no_grad()
    def score(self, prompts: list, completions: list[str], ground_truths: list[str]) -> list[RowScore]:
        """One score per row (a float, or a string saying why the row has none)."""
        n = len(completions)
        return list(self.fn(completions, ground_truths, list(range(n)), [{} for _ in range(n)],
                            prompts=prompts, spec=self.spec, model=self.model, tokenizer=self.tokenizer))

    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                 rows: torch.Tensor | None = None) -> list[torch.Tensor]:
        """A causal judge's token log-probs of each completion (`FrozenModel.logprobs`, in
        micro-batches of reward.model.batch_size rows); a classifier has none (ValueError)."""
        if self.spec["kind"] == "classifier":
            raise ValueError(f"reward.model.path={self.spec['path']}: a sequence-classification reward model "
                             "scores a whole text; it has no token log-probs")
        return super().logprobs(prompt_ids, completion_ids, rows)


def _layout(size: int, pad_id: int, max_tokens: int, prompt_ids: list[list[int]],
            completion_ids: list[list[int]]):
    """The judge's micro-batches of these rows for `logprobs`: `size` rows at most, within its
    token budget (`make_micro_batches`)."""
    return make_micro_batches(prompt_ids, completion_ids, size, pad_id, False, None, max_tokens)
