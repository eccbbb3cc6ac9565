"""The `sft` section: what `reasonrl sft` trains on (docs/sft.md). The rest of an SFT run's
config is `train`'s own sections: `model`, `optim`, `trainer` (steps or epochs, batch_size in
records, seed, eval_every, save_every, resume), `tracking`, `placement` (local), and for the
held-out accuracy by generation `data`, `reward`, `eval` and `rollout`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from reasonrl.config.fields import param

SFT_FIELDS = ("prompt", "completion", "messages", "tools")  # what sft.fields may rename


@dataclass
class SFTConfig:
    # files: sft.train_path / sft.val_path records ({prompt, completion} or {messages});
    # solver: the data.task's own training problems with worked solutions its solver writes
    # (countdown, arithmetic), the held-out loss on its held-out problems' solutions
    source: Literal["files", "solver"] = "files"
    # JSONL / JSON / Parquet / CSV / a `datasets` folder / a Hub dataset id; comma-separated for several
    train_path: str = ""
    train_subset: str = ""  # Hub ids: the subset (configuration); "" = the default one
    train_split: str = "train"  # Hub ids: the split; slicing allowed (train[:90%])
    val_path: str = ""  # records for the held-out loss and perplexity; "" = none
    val_subset: str = ""
    val_split: str = "test"
    val_size: int = param(0, ge=0)  # use at most this many held-out records (0 = all)
    # record field names when they differ, dotted for nested: {messages: conversation}
    fields: dict[str, str] = param({}, keys=SFT_FIELDS, noun="field")
    max_tokens: int = param(1024, ge=2)  # a record's tokens (prompt + completion) at most
    # a record over max_tokens: error = stop at start-up listing every such record (file:line);
    # right = keep its first max_tokens tokens (TRL's truncation_mode=keep_start)
    truncate: Literal["error", "right"] = "error"
    # true: the loss on the completion / assistant tokens only (TRL's completion_only_loss and
    # assistant_only_loss); false: on every token after the first, prompt and user turns included
    completion_only: bool = True
    # the held-out accuracy by generation (the eval `reasonrl train` runs: the data section's
    # held-out problems, scored by reward's verifier) before, every trainer.eval_every and after
    generate_eval: bool = True
