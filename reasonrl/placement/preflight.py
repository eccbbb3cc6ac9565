"""What the config asks of this machine, checked before any model loads (`preflight`), and
the model's context length read from its config.json alone (`model_positions`,
`check_model_context`)."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

import torch

from reasonrl.config import Config, check_context
from reasonrl.envs import environment_spec
from reasonrl.errors import ConfigError
from reasonrl.model.load import DEFAULT_MODEL_NAME, HUB_ID, TINY, resolve_model_dir
from reasonrl.placement.roles import Role, active
from reasonrl.registry import ENGINES, ENVIRONMENTS
from reasonrl.tracking import missing_extra


def preflight(cfg: Config) -> None:
    """What the config asks of this machine, checked before any model loads: the engine's
    and the tracking backends' extras, Ray for placement.mode=ray, peft for LoRA, the GPUs one
    engine needs on this machine in local mode (its ENGINES entry's `machine_gpus`; ray mode:
    `check_capacity`, once Ray is up), the environment of multi-turn runs (env.fn's class, the
    python tool's sandbox, what a registered environment's `check_run` asks of the whole run: an
    OpenEnv server's sessions), each role's own check (its table row's `check`: the policy's
    out-of-tree loss, `algo.loss_fn`, loaded and its signature checked here, so a ray-mode run
    fails in one line rather than inside an actor; a teacher with the student's tokenizer, the
    tokenizers only), and that the longest sequence fits each role's model's context
    (`check_model_context`: its config.json only)."""
    problems = [("rollout.engine", ENGINES[cfg.rollout.engine].missing())]
    problems += [("tracking.backends", missing_extra(b)) for b in cfg.tracking.backends]
    if cfg.placement.mode == "ray" and importlib.util.find_spec("ray") is None:
        problems.append(("placement.mode", "placement.mode=ray needs Ray: pip install 'reasonrl[ray]'"))
    if cfg.model.lora.rank > 0 and importlib.util.find_spec("peft") is None:
        problems.append(("model.lora.rank", "model.lora.rank > 0 needs peft: pip install 'reasonrl[lora]'"))
    need, key = ENGINES[cfg.rollout.engine].machine_gpus(cfg.rollout)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cfg.placement.mode == "local" and gpus < need:
        problems.append((key, f"{need} GPUs per engine, and this machine has {gpus}"))
    problems = [f"{key}: {problem}" for key, problem in problems if problem is not None]
    if problems:  # all of them at once: one install should not uncover the next problem
        raise ConfigError("\n".join(problems))
    environment_spec(cfg.env)  # env.fn imported and checked, the python tool's sandbox probed
    run_check = ENVIRONMENTS[cfg.env.name].check_run if cfg.env.name != "none" else None
    if run_check is not None:  # what the environment needs of the whole run (a server's sessions)
        run_check(cfg)
    running = active(cfg)
    for role, _ in running:
        if role.check is not None:
            role.check(cfg)
    check_model_context(cfg, running)


TINY_POSITIONS = 2048  # build_tiny_model's max_position_embeddings (a test checks they agree)
DEFAULT_POSITIONS = 8192  # the embedded SmolLM2-135M-Instruct's (a test checks its converted config)
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx")  # n_*: GPT-2-style configs


@functools.lru_cache(maxsize=16)
def model_positions(path: str, revision: str = "") -> tuple[int, str] | None:
    """(the context length in positions of `model.path`'s model, where it was read), without
    loading the model: its config.json's max_position_embeddings (or a multimodal config's
    text_config's); for a Hub id its config.json alone is fetched. None when the config names
    none, or a Hub config cannot be fetched now (loading the model then says why)."""
    if path == TINY:
        return TINY_POSITIONS, "max_position_embeddings of model.path=tiny"
    if not path:
        return DEFAULT_POSITIONS, f"max_position_embeddings of the default {DEFAULT_MODEL_NAME}"
    if not Path(path).expanduser().exists() and HUB_ID.match(path):
        from huggingface_hub import constants, hf_hub_download

        from reasonrl.cache import hub_unreachable

        offline = constants.HF_HUB_OFFLINE or hub_unreachable() is not None  # no retries without network
        try:
            config_file = Path(hf_hub_download(path, "config.json", revision=revision or None,
                                               local_files_only=offline))
        except Exception:  # offline, missing, private: the model's own load reports it
            return None
    else:
        config_file = resolve_model_dir(path) / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    sections = [config, config.get("text_config")] if isinstance(config, dict) else []
    for section in (s for s in sections if isinstance(s, dict)):
        for key in POSITION_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, f"{key} in {config_file}"
    return None


def check_model_context(cfg: Config, running: list[tuple[Role, int]] | None = None) -> None:
    """`check_context` (a ConfigError naming data.max_prompt_tokens, rollout.max_new_tokens and
    the limit) for each role's model that reads the policy's sequences (its table row's
    `context`: the policy's, critic.path's, teacher.path's)."""
    running = active(cfg) if running is None else running  # (role, count): `roles.active`
    models = [role.context(cfg) for role, _ in running if role.context is not None]
    for name, path, revision in (m for m in models if m is not None):
        found = model_positions(path, revision)
        if found is not None:
            check_context(cfg, *found, model=name)
