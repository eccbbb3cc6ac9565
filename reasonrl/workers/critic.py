"""The critic of PPO (`algo.advantage=gae`): a value model and the worker that trains it.

The value model is the policy's architecture with its LM head replaced by one output
(verl's and OpenRLHF's critic): V(s_t) = w . h_t + b, read at the hidden state that predicts
completion token t, the same positions as the token's log-prob (`completion_hidden`). It
starts from the policy's weights (or `critic.path`) and a zero head, so its first values are
0 and its first updates move the head before they move the body much.

The worker trains with the policy's `Learner` (`reasonrl.learn.learner`), given the critic's
`LearnerSettings` (`for_critic`, whose table says which keys are its own and which it inherits
from `optim`): its own AdamW (`critic.lr`), the same micro-batches (shared prompts, lean
kernels, flat buffers, `optim.gradient_checkpointing`), `optim.ppo_epochs` x
`optim.mini_batches` updates per step, and a loss normalised by the step's token count, so the
gradient does not depend on `critic.micro_batch_size` (tested). The loss is
the chosen value loss (`critic.value_loss`, `reasonrl.algo.value_loss`; the clipped one around
the values the critic gave before the step), through `reasonrl.algo.objective.value_objective`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import torch

from reasonrl.algo import Metric, Totals, ValueLossSettings, value_objective
from reasonrl.batch import CriticBatch
from reasonrl.config import CriticConfig, OptimConfig
from reasonrl.learn.learner import Learner, LearnerSettings, copy_weights
from reasonrl.model.forward import MicroBatch, pad_like, per_row, pick
from reasonrl.model.value import ValueModel, value_model

WEIGHTS_FILE = "value_model.safetensors"


class CriticWorker:
    """Values for a batch, and the value-loss updates of one step (see the module docstring):
    the value model and its `Learner`."""

    @classmethod
    def from_config(cls, cfg, host) -> CriticWorker:
        """The critic role in one process (algo.advantage=gae): `critic.path`'s model or a copy
        of the policy's (`colocate.base_model`) with a value head (its data-parallel ranks:
        `parallel.rank_critic`)."""
        from reasonrl.model.colocate import base_model

        lm, tokenizer = base_model(cfg, host, "critic")
        return cls(value_model(cfg, lm), tokenizer.pad_token_id, cfg.critic, cfg.optim,
                   precision=cfg.model.precision)

    def __init__(self, model: ValueModel, pad_id: int, critic: CriticConfig, optim: OptimConfig,
                 strategy=None, precision: str = "fp32"):
        self.model, self.pad_id, self.critic, self.optim = model, pad_id, critic, optim
        self.learner = Learner(model, pad_id, LearnerSettings.for_critic(critic, optim, precision), strategy)
        self.device = self.learner.device
        self.losses = ValueLossSettings.of(critic)

    @torch.no_grad()
    def values(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[torch.Tensor]:
        """Each completion's per-token values V(s_t), one unpadded float32 tensor per row."""
        return per_row(self.learner.micro_batches(prompt_ids, completion_ids), completion_ids, self.device,
                       lambda mb: self.model.completion_values(mb).cpu())

    def train_step(self, batch: CriticBatch) -> dict[str, float]:
        """`optim.ppo_epochs` passes over the batch, each in `optim.mini_batches` optimizer
        steps (contiguous slices, as the policy's: `Learner.train`) of the value loss, each a
        token mean over exactly its rows' model tokens; `critic/` metrics (averaged over the
        updates; the grad norm is the largest)."""
        n = len(batch.prompt_ids)
        keep = batch.loss_mask if batch.loss_mask is not None else torch.ones(n, dtype=torch.bool)
        rows = [i for i in range(n) if keep[i]]
        lr = self.learner.lr

        def update(idx: list[int]) -> dict[str, Metric]:
            chosen = [rows[i] for i in idx]
            masks = pick(batch.token_mask, chosen)
            completions = pick(batch.completion_ids, chosen)
            tokens = sum(len(c) for c in completions) if masks is None else sum(sum(m) for m in masks)
            totals = Totals(float(tokens), float(len(chosen)))
            objective = functools.partial(self.objective, totals, pick(batch.returns, chosen),
                                          pick(batch.old_values, chosen))
            return self.learner.update(pick(batch.prompt_ids, chosen), completions, masks, objective)

        found, updates = self.learner.train(len(rows), update)
        metrics = {"critic/vf_loss": 0.0, "critic/grad_norm": 0.0, "critic/skipped_update": 1.0}
        metrics.update({f"critic/{k}": v for k, v in found.items()})
        metrics.update({"critic/lr": lr, "critic/updates": float(updates)})
        return metrics

    def objective(self, totals: Totals, returns: list[torch.Tensor], old_values: list[torch.Tensor],
                  mb: MicroBatch) -> tuple[torch.Tensor, dict[str, Metric]]:
        """One micro-batch's values and `value_objective` against the rows' returns."""
        values = self.model.completion_values(mb)
        target = pad_like([returns[i].to(self.device) for i in mb.rows], values)
        old = pad_like([old_values[i].to(self.device) for i in mb.rows], values)
        return value_objective(values, old, target, mb.mask, self.losses, totals)

    # ---- checkpoint state ------------------------------------------------------------------

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor of the value model by name, tied ones once (bf16-mixed: the fp32 masters)."""
        seen: set[int] = set()
        for name, tensor in self.learner.full_weights().items():
            if tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                yield name, tensor.detach()

    def save(self, folder: Path) -> None:
        """The value model's weights (body and head) as one safetensors file in `folder`."""
        from safetensors.torch import save_file

        Path(folder).mkdir(parents=True, exist_ok=True)
        tensors = {k: v.contiguous().cpu() for k, v in self.named_weights()}
        save_file(tensors, str(Path(folder) / WEIGHTS_FILE))

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """The tensors `save` wrote (`read_weights`); a tied tensor comes through its first name."""
        copy_weights(self.model, tensors, "critic weights")
        self.learner.weights_loaded(tensors)

    def state_dict(self) -> dict:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state)

    def close(self) -> None:
        """Nothing to free beyond the object's own memory (data-parallel ranks leave their
        process group: the strategy's `close`)."""
        self.learner.close()


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The value model's tensors from a folder `CriticWorker.save` wrote."""
    from safetensors.torch import load_file

    path = Path(folder) / WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no critic weights (a checkpoint of a run without a critic?)")
    return load_file(str(path))
