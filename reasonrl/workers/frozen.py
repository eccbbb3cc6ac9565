"""Frozen models: a model with a batched no-grad forward, the one kind of worker the teacher, the
reference model and the judge are.

`FrozenModel` holds a model nothing trains and no weight sync reaches, and answers `logprobs`:
each completion's token log-probs under it, laid out in micro-batches by its `layout` (the
function that cuts rows into micro-batches), on its device, at its temperature. `rows=` asks for
some rows alone, computed in the micro-batches of exactly those rows (`rows_logprobs`): how the
update lays out the rows it trains on, so values read by the update are bitwise its own.

Three roles hold one (`reasonrl.placement.roles`):

- the teacher (`teacher.path`, `reasonrl.workers.teacher.TeacherWorker`): its own model, placed
  by `placement.teacher`, laid out by the policy's settings (`TeacherSettings`);
- the judge (`reward.model`, `reasonrl.workers.judge.RewardModelWorker`): its own model, loaded
  by its `from_config` and held by the worker, placed by `placement.judge` (isolated: a process
  of its own in local placement); its forward is `score` (a judge's verdict or number, a
  classifier's pooled logit), and a causal judge's `logprobs` are laid out in micro-batches of
  `reward.model.batch_size` rows;
- the reference (`algo.beta > 0` or `algo.log_kl`): served within the policy's worker (its
  table row's `within="policy"`: the same process, device and data-parallel ranks, so each rank's
  reference sees the rows its update sees). Its model is the policy's before training (a copy
  taken after the learner cast the model to the run's compute precision; with LoRA no copy: the
  policy's base with the adapter switched off, `lora.AdapterDisabled`) and its layout is the
  learner's own `micro_batches` (the same function, row cap, token budget and shared-prompt
  choice), so the reference log-probs of the update's rows are bitwise those the update would
  compute itself. The trainer calls it through `ReferenceOf`, the policy worker's
  `reference_logprobs` (a local worker or the Ray proxy over its ranks).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from reasonrl.model.forward import MicroBatch, completion_logprobs, per_row, pick
from reasonrl.weights import weights_checksum

Layout = Callable[[list[list[int]], list[list[int]]], list[MicroBatch]]


@torch.no_grad()
def rows_logprobs(model, layout: Layout, device, temperature: float, prompt_ids: list[list[int]],
                  completion_ids: list[list[int]], rows: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Each completion's token log-probs under `model` (float32, on the CPU), one unpadded tensor
    per row, in `layout`'s micro-batches; `rows` [N] bool: only those rows, in the micro-batches
    of exactly those rows (the other rows come back empty)."""
    keep = [i for i in range(len(prompt_ids)) if rows is None or rows[i]]
    out = [torch.zeros(0)] * len(prompt_ids)
    if not keep:
        return out
    kept = pick(completion_ids, keep)
    found = per_row(layout(pick(prompt_ids, keep), kept), kept, device,
                    lambda mb: completion_logprobs(model, mb, temperature)[0])
    for i, logp in zip(keep, found, strict=True):
        out[i] = logp.float().cpu()
    return out


class FrozenModel:
    """A model with a batched no-grad forward (see the module docstring). The model is given
    ready: its precision, kernels and eval mode are its owner's business."""

    def __init__(self, model, layout: Layout, device, temperature: float = 1.0):
        self.model, self.layout, self.device, self.temperature = model, layout, device, temperature

    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                 rows: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Each completion's token log-probs under the model (float32, on the CPU), one unpadded
        tensor per row: log p(y_t | prompt, y_<t) at the temperature. `rows` [N] bool: only
        those, in micro-batches of exactly those rows; the other rows come back empty."""
        return rows_logprobs(self.model, self.layout, self.device, self.temperature, prompt_ids,
                             completion_ids, rows)

    def weights_checksum(self) -> float:
        """`reasonrl.weights.weights_checksum` of the model's weights: the same all run long."""
        return weights_checksum(self.model.named_parameters())

    def close(self) -> None:
        """Nothing to free beyond the object's own memory."""


class ReferenceOf:
    """The reference role served within the policy's worker (its table row's `within`):
    `logprobs` is the policy worker's `reference_logprobs`, which runs the policy's
    `FrozenModel` reference (a local `PolicyWorker`, or the Ray proxy over the policy's ranks:
    each rank's reference computes its rows)."""

    def __init__(self, policy):
        self.policy = policy

    @classmethod
    def within(cls, cfg, policy) -> ReferenceOf:
        """The reference role of a run whose policy worker (or proxy) is `policy`."""
        return cls(policy)

    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                 rows: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The reference model's token log-probs of each completion (the reference stage); `rows`
        [N] bool: only those, laid out as the update lays them out (others empty)."""
        return self.policy.reference_logprobs(prompt_ids, completion_ids, rows)

    def close(self) -> None:
        """Nothing: the policy's worker holds the model and is closed with the others."""


def wants_reference(cfg) -> bool:
    """Whether the run has a reference model: a KL to it in the loss or the reward (algo.beta > 0),
    or the KL logged (algo.log_kl)."""
    return cfg.algo.beta > 0 or cfg.algo.log_kl
