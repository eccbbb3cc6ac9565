"""What a reward model or a generative judge computes from a loaded model: the text it reads,
one batched forward (or a short greedy answer), and the score read from it. No processes and no
loading here: `reasonrl.workers.judge` loads the model in its worker and calls these.

Two kinds (`reward.weights` names them; `reward.model` says which model):

- `classifier`: a sequence-classification reward model (`AutoModelForSequenceClassification`)
  reads the prompt and the completion as one chat, in its own chat template (the prompt's
  messages, then the completion as the assistant's turn; plain text joined by a blank line when
  the tokenizer has no template), as verl's discriminative reward model does
  (`verl/experimental/reward_loop/reward_loop.py`, `_preprocess_reward_inputs`). The score is
  the model's own pooled output (its logit at the last token that is not padding): the raw
  logit of a one-label head, as verl, OpenRLHF and TRL's `RewardTrainer` read it; P(label 1)
  of a two-label head.
- `judge`: a causal LM given `reward.model.template` (the rubric, with the question, the
  completion and the ground truth filled in) as one user message in its chat template. Its
  answer is read in one of two ways (`reward.model.parse`):
  `verdict` (default): one forward, no sampling: s = P(yes) / (P(yes) + P(no)) of the first
  answer token (`verdict_probability`), the verdict-token probability of Zhang et al. 2024
  ("Generative Verifiers: Reward Modeling as Next-Token Prediction", arXiv:2408.15240,
  sec. 3: r = p(Yes | x, y)), renormalised over the two verdicts so that mass on other tokens
  does not lower every score alike; `number`: a greedy answer of `max_new_tokens` tokens whose
  first number, divided by `max_score`, is the score (SkyRL's `llm_as_a_judge` example parses a
  "Final Score" line from the judge's text the same way, and scores 0 what it cannot parse;
  here that row fails and is counted).

Batches are padding-safe: the classifier pads on the right (each row's positions start at 0, and
the pooled token is each row's own last one); the judge pads on the left with positions from the
attention mask, so its last position is every row's next token (`logits_to_keep=1`: one
vocabulary row per completion, not one per token). A batch gives the scores each row gets alone,
to float rounding (tests/rewards/test_model_reward.py).

Each function returns one entry per text: the score (a float), or a string saying why that row
has none (an unparseable answer, a number out of range, a text longer than the model's
context): the scoring counts those as failures of that row alone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import torch

Prompt = str | list[dict[str, str]]
RowScore = float | str  # the score, or why the row has none

NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def chat_of(prompt: Prompt) -> list[dict[str, str]]:
    """An example's prompt as chat messages: a plain prompt is one user message."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def question_of(prompt: Prompt) -> str:
    """The question a judge is shown: a plain prompt itself, else the last user message."""
    if isinstance(prompt, str):
        return prompt
    users = [m["content"] for m in prompt if m.get("role") == "user"]
    return users[-1] if users else (prompt[-1]["content"] if prompt else "")


def _has_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def classifier_text(tokenizer, prompt: Prompt, completion: str) -> str:
    """What a classifier reads: the prompt's messages and the completion as the assistant's turn,
    in the tokenizer's chat template; without one, the two texts joined by a blank line."""
    if not _has_template(tokenizer):
        return "\n\n".join(m["content"] for m in chat_of(prompt)) + "\n\n" + completion
    chat = [*chat_of(prompt), {"role": "assistant", "content": completion}]
    return tokenizer.apply_chat_template(chat, tokenize=False)


def judge_text(tokenizer, template: str, prompt: Prompt, completion: str, ground_truth: str) -> str:
    """What a judge reads: `template` with {question}, {completion} and {ground_truth} filled in,
    as one user message followed by the assistant's turn opening (its chat template); without a
    template, the text and a new line."""
    message = template.format(question=question_of(prompt), completion=completion, ground_truth=ground_truth)
    if not _has_template(tokenizer):
        return message + "\n"
    return tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                         add_generation_prompt=True)


def first_token_ids(tokenizer, word: str) -> list[int]:
    """The tokens a verdict `word` can start with: its first token as written and after a space
    ("Yes" and " Yes" are two tokens in most vocabularies; which one a model uses depends on
    what precedes it)."""
    ids = []
    for text in (word, " " + word):
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if encoded and encoded[0] not in ids:
            ids.append(encoded[0])
    return ids


def verdict_probability(logits: torch.Tensor, yes_ids: Sequence[int], no_ids: Sequence[int]) -> torch.Tensor:
    """s = P(yes) / (P(yes) + P(no)) per row of next-token `logits` [B, V], with P(yes) the
    softmax probability summed over `yes_ids` (and P(no) over `no_ids`): the verdict-token score
    of Zhang et al. 2024 (arXiv:2408.15240, sec. 3), renormalised over the two verdicts.
    Computed as a softmax over the verdict tokens' logits alone, which is the same ratio (the
    partition function cancels) without a vocabulary-wide softmax; fp32. NaN where neither
    verdict has any probability (every verdict logit -inf)."""
    x = logits.float()
    yes = torch.logsumexp(x[:, list(yes_ids)], dim=-1)
    no = torch.logsumexp(x[:, list(no_ids)], dim=-1)
    return torch.sigmoid(yes - no)


def number_score(text: str, max_score: float) -> RowScore:
    """The first number of a judge's answer divided by `max_score`; why not, if it has none or
    it lies outside [0, max_score]."""
    found = NUMBER.search(text)
    if found is None:
        return f"no number in the judge's answer {text[:80]!r}"
    value = float(found.group())
    if not 0 <= value <= max_score:
        return (f"the judge's number {value:g} is outside 0..{max_score:g} (reward.model.max_score): "
                f"{text[:80]!r}")
    return value / max_score


def _too_long(tokenizer, model, texts: list[str]) -> tuple[list[list[int]], list[str | None]]:
    """Token ids of each text, and why a text cannot be scored (longer than the model's context)."""
    limit = getattr(model.config, "max_position_embeddings", None)
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    return ids, [f"{len(i)} tokens are more than the model's context ({limit})" if limit and len(i) > limit
                 else None for i in ids]


def _pad(rows: list[list[int]], pad_id: int, left: bool, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        span = slice(width - len(r), width) if left else slice(0, len(r))
        ids[i, span] = torch.tensor(r, dtype=torch.long)
        mask[i, span] = 1
    return ids.to(device), mask.to(device)


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _scored(texts: list[str], tokenizer, model, batch_size: int, score_batch) -> list[RowScore]:
    """`score_batch(rows of token ids) -> list[RowScore]` over the texts that fit the model's
    context, `batch_size` at a time; the others say why not."""
    ids, out = _too_long(tokenizer, model, texts)
    fit = [i for i, why in enumerate(out) if why is None]
    for start in range(0, len(fit), batch_size):
        chunk = fit[start: start + batch_size]
        for i, value in zip(chunk, score_batch([ids[i] for i in chunk]), strict=True):
            out[i] = value
    return out  # type: ignore[return-value]


@torch.no_grad()
def classifier_scores(model, tokenizer, texts: list[str], batch_size: int) -> list[RowScore]:
    """The classifier's score of each text (right-padded batches, the model's own pooling):
    the logit of a one-label head, P(label 1) of a two-label head."""
    def batch(rows: list[list[int]]) -> list[RowScore]:
        ids, mask = _pad(rows, _pad_id(tokenizer), left=False, device=model.device)
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        values = logits[:, 0] if logits.shape[-1] == 1 else torch.softmax(logits, dim=-1)[:, 1]
        return [v if math.isfinite(v) else f"the classifier's score is {v}" for v in values.tolist()]
    return _scored(texts, tokenizer, model, batch_size, batch)


def _left_batch(rows: list[list[int]], tokenizer, model) -> dict[str, torch.Tensor]:
    ids, mask = _pad(rows, _pad_id(tokenizer), left=True, device=model.device)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


@torch.no_grad()
def verdict_scores(model, tokenizer, texts: list[str], yes: str, no: str, batch_size: int) -> list[RowScore]:
    """The judge's verdict score of each text: `verdict_probability` of the next token after it
    (left-padded batches, positions from the attention mask, the last position's logits only)."""
    yes_ids, no_ids = first_token_ids(tokenizer, yes), first_token_ids(tokenizer, no)

    def batch(rows: list[list[int]]) -> list[RowScore]:
        logits = model(**_left_batch(rows, tokenizer, model), logits_to_keep=1).logits[:, -1]
        values = verdict_probability(logits, yes_ids, no_ids).tolist()
        return [v if math.isfinite(v) else f"the judge gives neither {yes!r} nor {no!r} any probability"
                for v in values]
    return _scored(texts, tokenizer, model, batch_size, batch)


@torch.no_grad()
def number_scores(model, tokenizer, texts: list[str], max_new_tokens: int, max_score: float,
                  batch_size: int) -> list[RowScore]:
    """The judge's greedy answer to each text (at most `max_new_tokens` tokens, left-padded
    batches), read by `number_score`."""
    def batch(rows: list[list[int]]) -> list[RowScore]:
        inputs = _left_batch(rows, tokenizer, model)
        inputs.pop("position_ids")  # generate derives them from the attention mask
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=_pad_id(tokenizer))
        answers = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        return [number_score(a, max_score) for a in answers]
    return _scored(texts, tokenizer, model, batch_size, batch)
