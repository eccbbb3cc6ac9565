"""The typed configuration tree: YAML file + dotted command-line overrides.

    schema.py   one dataclass per section; each field's type, default and own check (`param`);
                the larger sections in modules of their own (reward.py, placement.py, sft.py, ...)
    loader.py   `load_config`: YAML (with `include:`), overrides, unknown keys, types, ranges
    rules.py    the rules across keys, grouped by the section whose key an error names; the
                model-context check the preflight runs (`check_context`)

`from reasonrl.config import X` is the way in for every name below.
"""

from reasonrl.config.fields import param
from reasonrl.config.loader import MOVED, dump_yaml, load_config, parse_override, to_dict
from reasonrl.config.placement import PlacementConfig, PolicyPlacement, RolloutPlacement, WorkerPlacement
from reasonrl.config.reasoning_gym import ReasoningGymConfig
from reasonrl.config.reward import RewardConfig, RewardModelConfig
from reasonrl.config.rules import (
    RULES,
    after_prompt,
    check_context,
    check_device,
    resolve_device,
    validate,
)
from reasonrl.config.schema import (
    DATA_FIELDS,
    DEFAULT_SYSTEM_PROMPT,
    AlgoConfig,
    ArithmeticConfig,
    Config,
    CountdownConfig,
    CriticConfig,
    DataConfig,
    EnvConfig,
    EvalConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    PiecewiseConfig,
    RolloutConfig,
    TeacherConfig,
    TrackingConfig,
    TrainerConfig,
    VLLMConfig,
    WandbConfig,
)
from reasonrl.errors import ConfigError

__all__ = [
    "DATA_FIELDS", "DEFAULT_SYSTEM_PROMPT", "MOVED", "RULES", "AlgoConfig", "ArithmeticConfig", "Config",
    "ConfigError", "CountdownConfig", "CriticConfig", "DataConfig", "EnvConfig", "EvalConfig", "LoraConfig",
    "ModelConfig", "OptimConfig", "PiecewiseConfig", "PlacementConfig", "PolicyPlacement",
    "ReasoningGymConfig", "RewardConfig", "RewardModelConfig", "RolloutConfig", "RolloutPlacement",
    "TeacherConfig",
    "TrackingConfig", "TrainerConfig", "VLLMConfig", "WandbConfig", "WorkerPlacement", "after_prompt",
    "check_context", "check_device", "dump_yaml", "load_config", "param", "parse_override",
    "resolve_device", "to_dict", "validate",
]
