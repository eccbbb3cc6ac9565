"""The critic of PPO (`algo.advantage=gae`): a value model and the worker that trains it.

The value model is the policy's architecture with its LM head replaced by one output
(verl's and OpenRLHF's critic): V(s_t) = w . h_t + b, read at the hidden state that predicts
completion token t, the same positions as the token's log-prob (`completion_hidden`). It
starts from the policy's weights (or `critic.path`) and a zero head, so its first values are
0 and its first updates move the head before they move the body much.

The worker mirrors the policy worker: its own AdamW (`critic.lr`), the same micro-batches
(shared prompts, lean kernels, flat buffers, `optim.gradient_checkpointing`),
`optim.ppo_epochs` x `optim.mini_batches` updates per step, and a loss normalised by the step's
token count, so the gradient does not depend on `critic.micro_batch_size` (tested). The loss is
the chosen value loss (`critic.value_loss`, `reasonrl.algo.value_loss`; the clipped one around
the values the critic gave before the step), through `reasonrl.algo.objective.value_objective`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from reasonrl.accel import TrainingAccel, fused_adam_ok
from reasonrl.algo import Totals, ValueLossSettings, value_objective
from reasonrl.batch import CriticBatch
from reasonrl.config import CriticConfig, OptimConfig
from reasonrl.policy.checkpointing import checkpoint_layers
from reasonrl.policy.worker import MicroBatch, completion_hidden, make_micro_batches, pad_like, per_row

WEIGHTS_FILE = "value_model.safetensors"


class ValueModel(nn.Module):
    """A causal LM's decoder and a scalar value head, zero-initialised. The LM head is unused:
    an untied one is frozen (no gradient or optimizer memory)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm, self.config = lm, lm.config
        embed = lm.get_input_embeddings().weight
        self.value_head = nn.Linear(lm.config.hidden_size, 1, device=embed.device, dtype=embed.dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        head = lm.get_output_embeddings()
        if head is not None and head.weight is not embed:
            head.weight.requires_grad_(False)

    route_through_forward = False  # set by FSDP2 sharding (`reasonrl.policy.parallel`)

    def get_decoder(self) -> nn.Module:
        return self if self.route_through_forward else self.lm.get_decoder()

    def forward(self, **kwargs):
        """The decoder's forward. Sharded with FSDP2, the decoder call is routed through here so
        that the root's parameters are gathered (`get_decoder` returns the model itself)."""
        return self.lm.get_decoder()(**kwargs)

    def completion_values(self, mb: MicroBatch) -> torch.Tensor:
        """[M, T] V(s_t) at each completion token's position, in float32."""
        hidden = completion_hidden(self, mb)
        return self.value_head(hidden).squeeze(-1).float()


class CriticWorker:
    """Values for a batch, and the value-loss updates of one step (see the module docstring)."""

    def __init__(self, model: ValueModel, pad_id: int, critic: CriticConfig, optim: OptimConfig):
        self.model, self.pad_id, self.critic, self.optim = model, pad_id, critic, optim
        self.accel = TrainingAccel(model, kernels=optim.lean_kernels)
        if optim.gradient_checkpointing:  # after the kernels, as the policy (plain micro-batches)
            checkpoint_layers(model)
        self.model.train()
        self.device = next(model.parameters()).device
        self.micro_batch_size = critic.micro_batch_size or optim.micro_batch_size
        self.losses = ValueLossSettings.of(critic)
        self.share_prompt = optim.share_prompt and not optim.gradient_checkpointing
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=critic.lr, betas=tuple(optim.betas), eps=optim.eps,
                                           weight_decay=critic.weight_decay,
                                           fused=fused_adam_ok(trainable) or None)
        self.accel.attach(self.optimizer)
        self.step = 0

    def micro_batches(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                      token_masks: list[list[int]] | None = None) -> list[MicroBatch]:
        return make_micro_batches(prompt_ids, completion_ids, self.micro_batch_size, self.pad_id,
                                  self.share_prompt, token_masks)

    def train_micro_batches(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                            token_masks: list[list[int]] | None = None) -> list[MicroBatch]:
        """The micro-batches this process trains on (a data-parallel rank takes its share)."""
        return self.micro_batches(prompt_ids, completion_ids, token_masks)

    @torch.no_grad()
    def values(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[torch.Tensor]:
        """Each completion's per-token values V(s_t), one unpadded float32 tensor per row."""
        return per_row(self.micro_batches(prompt_ids, completion_ids), completion_ids, self.device,
                       lambda mb: self.model.completion_values(mb).cpu())

    def train_step(self, batch: CriticBatch) -> dict[str, float]:
        """`optim.ppo_epochs` passes over the batch, each in `optim.mini_batches` optimizer
        steps (contiguous slices, as the policy's), of the clipped value loss; `critic/`
        metrics (averaged over the updates; the grad norm is the largest)."""
        n = len(batch.prompt_ids)
        keep = batch.loss_mask if batch.loss_mask is not None else torch.ones(n, dtype=torch.bool)
        rows = [i for i in range(n) if keep[i]]
        splits = [s.tolist() for s in torch.arange(len(rows)).tensor_split(self.optim.mini_batches) if len(s)]
        lr = self.optimizer.param_groups[0]["lr"]
        updates = []
        for _ in range(self.optim.ppo_epochs):
            for idx in splits:
                chosen = [rows[i] for i in idx]
                updates.append(self._update([batch.prompt_ids[i] for i in chosen],
                                            [batch.completion_ids[i] for i in chosen],
                                            [batch.returns[i] for i in chosen],
                                            [batch.old_values[i] for i in chosen],
                                            None if batch.token_mask is None
                                            else [batch.token_mask[i] for i in chosen]))
        self.step += 1
        metrics = {"critic/vf_loss": 0.0, "critic/grad_norm": 0.0, "critic/skipped_update": 1.0}
        if updates:
            metrics.update({f"critic/{k}": sum(u[k] for u in updates) / len(updates) for k in updates[0]})
            metrics["critic/grad_norm"] = max(u["grad_norm"] for u in updates)
            metrics["critic/skipped_update"] = max(u["skipped_update"] for u in updates)
        metrics.update({"critic/lr": lr, "critic/updates": float(len(updates))})
        return metrics

    def _update(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                returns: list[torch.Tensor], old_values: list[torch.Tensor],
                token_masks: list[list[int]] | None = None) -> dict[str, float]:
        """One optimizer step on these rows; the loss is the token mean over exactly these rows'
        model tokens (`token_masks` leave an episode's environment tokens out)."""
        num_tokens = float(max(sum(len(c) for c in completion_ids) if token_masks is None
                               else sum(sum(m) for m in token_masks), 1))
        totals = Totals(num_tokens, float(len(completion_ids)))
        sums: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        grad_buffer = self.accel.gradients()
        for mb in self.train_micro_batches(prompt_ids, completion_ids, token_masks):
            mb = mb.to(self.device)
            values = self.model.completion_values(mb)
            target = pad_like([returns[i].to(self.device) for i in mb.rows], values)
            old = pad_like([old_values[i].to(self.device) for i in mb.rows], values)
            loss, metrics = value_objective(values, old, target, mb.mask, self.losses, totals)
            self.accel.before_backward()
            loss.backward()
            for name, m in metrics.items():
                sums[name] = sums.get(name, 0.0) + m.value
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.critic.max_grad_norm if self.critic.max_grad_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm).item() if params else 0.0
        skipped = not math.isfinite(grad_norm) or not math.isfinite(sums["vf_loss"])
        if not skipped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        del grad_buffer
        return {**sums, "grad_norm": grad_norm, "skipped_update": float(skipped)}

    # ---- checkpoint state ------------------------------------------------------------------

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor of the value model by name, tied ones once."""
        seen: set[int] = set()
        for name, tensor in self.model.state_dict().items():
            if tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                yield name, tensor.detach()

    def save(self, folder: Path) -> None:
        """The value model's weights (body and head) as one safetensors file in `folder`."""
        from safetensors.torch import save_file

        Path(folder).mkdir(parents=True, exist_ok=True)
        tensors = {k: v.contiguous().cpu() for k, v in self.named_weights()}
        save_file(tensors, str(Path(folder) / WEIGHTS_FILE))

    @torch.no_grad()
    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """The tensors `save` wrote (`read_weights`); a tied tensor comes through its first name."""
        params = self.model.state_dict(keep_vars=True)
        unknown = set(tensors) - set(params)
        absent = {n for n in set(params) - set(tensors)
                  if params[n].data_ptr() not in {params[k].data_ptr() for k in tensors if k in params}}
        if unknown or absent:
            raise KeyError(f"critic weights do not match the value model: missing {sorted(absent)[:5]}, "
                           f"unexpected {sorted(unknown)[:5]}")
        for name, tensor in tensors.items():
            params[name].copy_(tensor)

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.accel.state_loaded(self.optimizer)
        self.step = state["step"]

    def close(self) -> None:
        """Nothing to free beyond the object's own memory (a data-parallel rank leaves its
        process group)."""


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The value model's tensors from a folder `CriticWorker.save` wrote."""
    from safetensors.torch import load_file

    path = Path(folder) / WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no critic weights (a checkpoint of a run without a critic?)")
    return load_file(str(path))
