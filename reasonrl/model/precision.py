"""`model.precision`: which dtype the weights are kept in, and which the model computes in.

| precision | master weights and optimizer state | forward, backward, rollout, reference |
|---|---|---|
| `fp32` (default) | fp32 | fp32 |
| `bf16-mixed` | fp32 | bf16 (log-probs, loss, KL, advantages in fp32) |
| `bf16` | bf16 | bf16 |
| `auto` | `bf16-mixed` where a calibration on this machine measured it faster, else `fp32` |

bf16-mixed is the mixed precision of Micikevicius et al. 2018 ("Mixed Precision Training",
arXiv:1710.03740, sec. 3.1: an fp32 master copy of the weights is what the optimizer updates;
the forward and backward run on a half-precision copy made from it) in the form PyTorch's
FSDP2 gives it (`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`): the model's own
parameters are the bf16 compute copy, `MasterWeights` holds the fp32 masters, each
micro-batch's bf16 gradient is added into an fp32 gradient as soon as autograd has it
(`register_post_accumulate_grad_hook`: the bf16 gradient is freed at once, and the sum over
micro-batches is an fp32 sum), AdamW clips and steps the masters, and the compute copy is
cast from them (round to nearest) after each step. TRL (`bf16=True` through accelerate),
verl's FSDP `mixed_precision` and OpenRLHF (DeepSpeed bf16) keep fp32 masters the same way.

Why a bf16 copy of the weights and not `torch.autocast`: autocast keeps the weights fp32 and
casts them, and every activation, at each matrix product; the residual stream and every
element-wise op stay fp32. On a 2-core Sapphire Rapids CPU (AMX-BF16) a SmolLM2-135M
forward+backward of 8 x 188 tokens took 7.8 s in fp32, 6.7 s under CPU autocast and 4.3 s
with bf16 weights; the custom autograd functions of the lean kernels and the chunked LM head
then also see one dtype in their backward (autocast does not reach a backward).

LoRA keeps its adapters (and a critic's value head beside them) trainable in fp32: the frozen
base computes in bf16 and peft casts the adapter's input to the adapter's dtype, as peft does
by default for a bf16 base (`autocast_adapter_dtype`); they need no master copy. Data-parallel
ranks (FSDP2) use FSDP2's own `MixedPrecisionPolicy`: the sharded fp32 parameters are its
masters (`reasonrl.model.sharding`).

Pure `bf16` keeps no fp32 copy (it saves the masters' memory), but an update smaller than half
a weight's bf16 spacing rounds away: at lr 2e-5 most of them. The learner then counts the
share of weight elements a step left bitwise unchanged (`train/params_unchanged`) and warns
when it is high.
"""

from __future__ import annotations

import torch
from torch import nn

from reasonrl import console
from reasonrl.model.lora import is_lora

PRECISIONS = ("fp32", "bf16-mixed", "bf16", "auto")
UNCHANGED_WARNING = 0.5  # train/params_unchanged above this: say that the updates round away


def load_dtype(precision: str) -> torch.dtype:
    """The dtype a model is loaded in: bf16 for pure `bf16`; fp32 otherwise (bf16-mixed's
    masters are the fp32 weights as loaded; the learner makes the compute copy)."""
    check(precision)
    return torch.bfloat16 if precision == "bf16" else torch.float32


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype a model computes in: fp32 for `fp32`, bf16 for `bf16-mixed` and `bf16`."""
    check(precision)
    return torch.float32 if precision == "fp32" else torch.bfloat16


def check(precision: str) -> None:
    if precision not in PRECISIONS or precision == "auto":
        allowed = ", ".join(p for p in PRECISIONS if p != "auto")
        raise ValueError(f"model.precision: {precision!r} is not a resolved precision ({allowed}); "
                         "`auto` is resolved before any model loads (`resolve`)")


def cast_for_compute(model: nn.Module, precision: str) -> nn.Module:
    """`model`'s parameters cast to the compute dtype in place (a model only served or scored:
    a rollout engine's, the reference). Buffers keep their dtype (the rotary frequencies stay
    fp32, as when transformers loads a model in bf16)."""
    dtype = compute_dtype(precision)
    with torch.no_grad():
        for p in model.parameters():
            if p.dtype != dtype and p.is_floating_point():
                p.data = p.data.to(dtype)
    return model


class MasterWeights:
    """fp32 master copies of a model's trainable parameters, the model itself cast to bf16
    (`model.precision=bf16-mixed`; see the module docstring). The optimizer is given `params`;
    after each backward the bf16 gradients are already summed into theirs; `write_back` after
    each optimizer step (and after a load) casts the masters into the model."""

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16):
        self.model, self.dtype = model, dtype
        # a LoRA model, or one holding it (a critic's ValueModel around a peft model)
        lora = any(is_lora(m) for m in model.modules())
        self.pairs: list[tuple[nn.Parameter, torch.Tensor]] = []
        with torch.no_grad():
            for p in model.parameters():  # a tied tensor once
                if not p.is_floating_point():
                    continue
                if p.requires_grad and lora:  # adapters (and a value head) train in fp32 as they are
                    continue
                if p.requires_grad:
                    # a Parameter like the model's: the optimizer's fused AdamW and the single
                    # gradient buffer (`reasonrl.accel.memory`) take it
                    master = nn.Parameter(p.detach().clone().float())
                    self.pairs.append((p, master))
                    p.register_post_accumulate_grad_hook(self._accumulate(master))
                p.data = p.data.to(dtype)
        self.master_of = {id(p): m for p, m in self.pairs}

    @staticmethod
    def _accumulate(master: torch.Tensor):
        def hook(p: torch.Tensor) -> None:
            if master.grad is None:
                master.grad = p.grad.float()
            else:
                master.grad.add_(p.grad)
            p.grad = None  # the bf16 gradient's memory goes back at once
        return hook

    def params(self, trainable: list[torch.Tensor]) -> list[torch.Tensor]:
        """What the optimizer steps: each trainable parameter's master (itself where it has
        none: LoRA's fp32 adapters), in the same order."""
        return [self.master_of.get(id(p), p) for p in trainable]

    @torch.no_grad()
    def write_back(self) -> None:
        """The compute copy cast from the masters (round to nearest even)."""
        for p, master in self.pairs:
            p.copy_(master)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The model's state dict with each mastered parameter's fp32 master in its place: what
        a checkpoint's weights are (a resume then starts from exactly the masters)."""
        return {name: self.master_of.get(id(t), t).detach()
                for name, t in self.model.state_dict(keep_vars=True).items()}

    @torch.no_grad()
    def load(self, tensors: dict[str, torch.Tensor]) -> None:
        """Masters from saved tensors by name (a tied tensor may come under either of its
        names), then the compute copy from them."""
        for name, t in self.model.state_dict(keep_vars=True).items():
            master = self.master_of.get(id(t))
            if master is not None and name in tensors:
                master.copy_(tensors[name])
        self.write_back()


class UnchangedCounter:
    """`train/params_unchanged` for pure bf16: the share of trainable weight elements that an
    optimizer step left bitwise equal (updates below half a bf16 spacing round away; a weight
    of 0.05 has a spacing of 2.4e-4, so an lr 2e-5 AdamW step of ~2e-5 is lost)."""

    def __init__(self) -> None:
        self.warned = False

    @staticmethod
    def snapshot(params: list[torch.Tensor]) -> list[torch.Tensor]:
        return [p.detach().clone() for p in params]

    def fraction(self, before: list[torch.Tensor], params: list[torch.Tensor], step: int) -> float:
        same = sum(int((b == p.detach()).sum()) for b, p in zip(before, params, strict=True))
        total = sum(p.numel() for p in params)
        share = same / max(total, 1)
        if share > UNCHANGED_WARNING and not self.warned:
            self.warned = True
            console.warning(f"model.precision=bf16: the update of step {step + 1} left "
                            f"{share:.1%} of the weights unchanged (updates below half a bf16 spacing round "
                            "away); model.precision=bf16-mixed keeps fp32 master weights")
        return share


def model_shapes(path: str, revision: str = "") -> tuple[int, int]:
    """(hidden_size, intermediate_size) of `model.path`'s model, from its config alone."""
    from reasonrl.model.load import TINY, resolve_model_dir

    if path == TINY:
        return 64, 128  # `build_tiny_model`'s defaults
    import json

    config = json.loads((resolve_model_dir(path, revision) / "config.json").read_text())
    hidden = int(config.get("hidden_size", 0) or config.get("n_embd", 0) or 576)
    return hidden, int(config.get("intermediate_size", 0) or 4 * hidden)


def resolve(precision: str, path: str, revision: str, tokens: int,
            device: str = "cpu") -> tuple[str, str | None]:
    """(the precision to run in, why; None when none was asked for): the one resolver of
    `model.precision=auto` (a config's: `reasonrl.placement.precision_decision`, its only caller).

    `auto` is decided by `reasonrl.accel.calibrate.precision_choice`: a short measurement of a
    decoder MLP's forward and backward at this model's shapes in fp32 and in bf16 on this
    machine (cached per CPU, flags, threads and shapes; `reasonrl calibrate` shows and resets
    it): bf16-mixed when bf16 is faster by a clear margin, fp32 elsewhere. Any other value is
    taken as it is."""
    if precision != "auto":
        check(precision)
        return precision, None
    from reasonrl.accel.calibrate import precision_choice

    hidden, intermediate = model_shapes(path, revision)
    choice, why = precision_choice(hidden, intermediate, tokens, device)
    return choice, why
