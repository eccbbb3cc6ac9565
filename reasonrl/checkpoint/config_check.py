"""Whether a resumed run computes what the checkpoint's run computed: the resolved config a
checkpoint saves (and `config_hash`, its fingerprint) compared key by key with the resumed
run's.

A changed key is refused, every one named at once, unless it changes nothing computed
(`RESUME_SAFE_KEYS`: neither compared nor hashed) or the resume accepts it
(`trainer.allow_config_change`) and it is one a resume can change (`RESUME_CHANGEABLE`): those
take effect from the first resumed step. Any other key cannot: a resume continues the
checkpoint's weights, data order, RNG streams and batches in flight, which the old value made.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from reasonrl.errors import ConfigError

# Keys a resumed run may change without asking: they do not change what is computed
# (where the run lives, how often it evaluates or logs, how many checkpoints it keeps, which
# Ray instance it starts or joins, how long it waits for Ray's workers).
# `trainer.steps` is not among them: the LR schedule is laid out over it. Extending a
# run is `--allow-config-change trainer.steps` (the schedule recomputed at the resumed step).
RESUME_SAFE_KEYS = (
    "trainer.resume", "trainer.allow_config_change", "trainer.progress", "trainer.output_dir",
    "trainer.run_name", "trainer.keep_last", "trainer.max_bad_steps", "trainer.save_every",
    "trainer.eval_every", "trainer.log_samples", "trainer.threads", "trainer.console",
    "placement.address", "placement.num_cpus", "placement.start_timeout", "placement.call_timeout",
)


# Keys a resume can change when `--allow-config-change` lists them, each in force from the first
# resumed step (tests/checkpoint/test_resume_changes.py changes each one and checks what that step used):
# what the new value controls. The optimizer's settings are the run's, not the checkpoint's
# (`reasonrl.learn.learner.Learner.apply_settings`), and the LR schedule is recomputed from the
# new base LR at the resumed step.
RESUME_CHANGEABLE = {
    "optim.lr": "the policy's learning rate (times the schedule's factor at the step)",
    "optim.weight_decay": "the policy's AdamW weight decay",
    "optim.betas": "the policy's AdamW betas (the moments kept continue under them)",
    "optim.eps": "the policy's AdamW epsilon",
    "optim.max_grad_norm": "the policy's gradient clip",
    "optim.schedule": "the LR schedule's shape, recomputed at the resumed step",
    "optim.warmup_ratio": "the LR warm-up, recomputed at the resumed step",
    "optim.min_lr_ratio": "the cosine schedule's floor, recomputed at the resumed step",
    "optim.micro_batch_size": "rows per forward/backward (the gradient does not change)",
    "optim.max_tokens_per_micro_batch": "positions per forward/backward (the gradient does not change)",
    "trainer.steps": "the run's length; the LR schedule is laid over it, recomputed at the resumed step",
    "critic.lr": "the critic's learning rate",
    "critic.weight_decay": "the critic's AdamW weight decay",
    "critic.max_grad_norm": "the critic's gradient clip",
    "placement.mode": "where the workers run (the same computation in Ray actors or in this process)",
}


# Keys whose value a run decides at its start when the config leaves it to the machine (this
# value: `auto` or 0), and saves decided (`reasonrl.train.choices`). A checkpoint saved before a
# key was decided at start holds the undecided value: the resume's decided one is no change.
UNDECIDED = {"model.precision": "auto", "rollout.hf_decoder": "auto", "optim.max_tokens_per_micro_batch": 0,
             "trainer.threads": 0, "rollout.threads": 0}


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_hash(config: dict) -> str:
    """sha256 of the resolved config without the keys a resume may change."""
    kept = {k: v for k, v in flatten(config).items() if k not in RESUME_SAFE_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def version_difference(key: str, saved: dict, current: dict) -> bool:
    """`key` is on one side only because the config's keys changed between reasonrl versions,
    not because the run's settings did: a key added since the checkpoint holding its default
    (which keeps the behaviour from before it existed), or one removed since whose value meant
    what the new default means (`reasonrl.config.loader.REPLACED` maps it to None)."""
    from reasonrl.config import Config, to_dict
    from reasonrl.config.loader import REPLACED

    if key in current:
        return flatten(to_dict(Config())).get(key, object()) == current[key]
    return key in REPLACED and REPLACED[key](saved[key]) is None


def config_changes(saved: dict, current: dict) -> dict[str, tuple[object, object]]:
    """{dotted key: (saved, current)} for every key that differs, safe keys,
    `version_difference`s and automatic choices the checkpoint left undecided excluded."""
    a, b = flatten(saved), flatten(current)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if k not in RESUME_SAFE_KEYS and a.get(k) != b.get(k)
            and not ((k in a) != (k in b) and version_difference(k, a, b))
            and not (k in UNDECIDED and k in a and a[k] == UNDECIDED[k])}


def check_config_changes(path: Path, saved: dict, current: dict,
                         allowed: list[str]) -> dict[str, tuple[object, object]]:
    """The changes since the checkpoint at `path` was written (`config_changes`), all of them
    keys in `allowed` (`trainer.allow_config_change`) and in `RESUME_CHANGEABLE`. A ConfigError
    otherwise: first every changed key a resume cannot change, allowed or not; then every
    changeable key that is not allowed."""
    changes = config_changes(saved, current)
    fixed = {k: v for k, v in changes.items() if k not in RESUME_CHANGEABLE}
    if fixed:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in fixed.items())
        raise ConfigError(f"resuming {path}: {listed}: {'these keys' if len(fixed) > 1 else 'this key'} "
                          f"cannot change on resume, even with --allow-config-change (the checkpoint's "
                          f"weights, data order, RNG streams and batches in flight continue from the old "
                          f"value). A resume can change: {', '.join(RESUME_CHANGEABLE)}. Resume with the "
                          f"run's own value, or start a new run (model.path={path}/huggingface starts "
                          f"from its weights)")
    refused = {k: v for k, v in changes.items() if k not in allowed}
    if refused:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in refused.items())
        raise ConfigError(f"resuming {path}: the config changed ({listed}). Resume with the run's own "
                          f"config, or accept the change with --allow-config-change {','.join(refused)}")
    return changes
