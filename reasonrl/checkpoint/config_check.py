"""Whether a resumed run computes what the checkpoint's run computed: the resolved config a
checkpoint saves (and `config_hash`, its fingerprint) compared key by key with the resumed
run's.

A changed key is refused, every one named at once, unless the resume accepts it
(`trainer.allow_config_change`) or it changes nothing computed (`RESUME_SAFE_KEYS`: neither
compared nor hashed).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from reasonrl.errors import ConfigError

# Keys a resumed run may change without asking: they do not change what is computed
# (where the run lives, how often it evaluates or logs, how many checkpoints it keeps).
# `trainer.steps` is not among them: the LR schedule is laid out over it. Extending a
# run is `--allow-config-change trainer.steps` (exact only with a constant schedule).
RESUME_SAFE_KEYS = (
    "trainer.resume", "trainer.allow_config_change", "trainer.progress", "trainer.output_dir",
    "trainer.run_name", "trainer.keep_last", "trainer.max_bad_steps", "trainer.save_every",
    "trainer.eval_every", "trainer.log_samples", "trainer.threads",
)


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
    """{dotted key: (saved, current)} for every key that differs, safe keys and
    `version_difference`s excluded."""
    a, b = flatten(saved), flatten(current)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if k not in RESUME_SAFE_KEYS and a.get(k) != b.get(k)
            and not ((k in a) != (k in b) and version_difference(k, a, b))}


def check_config_changes(path: Path, saved: dict, current: dict, allowed: list[str]) -> None:
    """ConfigError listing every key that changed since the checkpoint at `path` was written,
    except the keys in `allowed` (`trainer.allow_config_change`)."""
    refused = {k: v for k, v in config_changes(saved, current).items() if k not in allowed}
    if refused:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in refused.items())
        raise ConfigError(f"resuming {path}: the config changed ({listed}). Resume with the run's own "
                          f"config, or accept the change with --allow-config-change {','.join(refused)}")
