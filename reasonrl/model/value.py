"""The value model of PPO's critic (`algo.advantage=gae`): the policy's architecture with its LM
head replaced by one output (verl's and OpenRLHF's critic): V(s_t) = w . h_t + b, read at the
hidden state that predicts completion token t, the same positions as the token's log-prob
(`completion_hidden`). The head starts at zero, so the first values are 0. The worker that
trains it is `reasonrl.workers.critic.CriticWorker`.
"""

from __future__ import annotations

import torch
from torch import nn

from reasonrl.model.forward import MicroBatch, completion_hidden


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

    route_through_forward = False  # set by FSDP2 sharding (`reasonrl.workers.ranks`)

    def get_decoder(self) -> nn.Module:
        return self if self.route_through_forward else self.lm.get_decoder()

    def forward(self, **kwargs):
        """The decoder's forward. Sharded with FSDP2, the decoder call is routed through here so
        that the root's parameters are gathered (`get_decoder` returns the model itself)."""
        return self.lm.get_decoder()(**kwargs)

    def completion_values(self, mb: MicroBatch) -> torch.Tensor:
        """[M, T] V(s_t) at each completion token's position, in float32."""
        hidden = completion_hidden(self, mb)
        # LoRA with bf16-mixed: a bf16 body, the trained head in fp32
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()


def value_model(cfg, lm) -> ValueModel:
    """`lm` with a zero value head (and the policy's LoRA settings: adapters on the body, the
    head trained in full)."""
    lo = cfg.model.lora
    if lo.rank > 0:
        from reasonrl.model.lora import apply_lora

        lm = apply_lora(lm, lo.rank, lo.alpha, lo.dropout, lo.target_modules, seed=cfg.trainer.seed + 1)
    return ValueModel(lm)
