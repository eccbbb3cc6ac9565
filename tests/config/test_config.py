"""Tests for reasonrl.config: the typed tree, YAML + dotted overrides, and start-up errors."""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path

import pytest
import yaml
from helpers import HAS_PEFT

from reasonrl.cli import main
from reasonrl.config import (
    DEFAULT_SYSTEM_PROMPT,
    Config,
    ConfigError,
    TrainerConfig,
    dump_yaml,
    load_config,
    parse_override,
)
from reasonrl.data import system_prompt_for
from reasonrl.registry import ADVANTAGES, REWARD_COMPONENTS

REPO_ROOT = Path(__file__).resolve().parents[2]

TRAINER_KEYS = ", ".join(f.name for f in dataclasses.fields(TrainerConfig))
SECTIONS = ", ".join(f.name for f in dataclasses.fields(Config))  # model, data, ..., tracking


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def config_error(*overrides: str, path: str | Path | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    return str(info.value)


# ------------------------------------------------------------------------ defaults, YAML


def test_defaults_load():
    cfg = load_config(None)
    assert cfg == Config()
    assert cfg.model.path == ""
    assert cfg.data.task == "arithmetic"
    assert cfg.data.system_prompt == "auto"  # the task's own: arithmetic's is DEFAULT_SYSTEM_PROMPT
    assert system_prompt_for(cfg.data) == DEFAULT_SYSTEM_PROMPT
    assert cfg.data.arithmetic.operators == ["+"]
    assert (cfg.rollout.n, cfg.trainer.batch_size, cfg.trainer.steps) == (4, 32, 20)
    assert cfg.reward.weights == {"correct": 1.0}
    assert cfg.algo.advantage == "grpo"
    assert cfg.optim.lr == 1e-5


def test_yaml_file_and_overrides_parsed_as_yaml(tmp_path):
    path = write(tmp_path, "run.yaml", """
        model: {path: tiny}
        trainer: {steps: 100, batch_size: 16, run_name: from_file}
        rollout: {n: 4}
        reward: {weights: {correct: 2.0, boxed: 0.5}}
    """)
    cfg = load_config(path, [
        "trainer.steps=5",
        "reward.weights={correct: 1.0, format: 0.1}",
        "data.arithmetic.operators=[+, -]",
        "data.shuffle=false",
        "optim.betas=[0.8, 0.95]",
        "trainer.run_name=",
    ])
    assert cfg.model.path == "tiny"
    assert cfg.trainer.steps == 5  # override beats the file
    assert cfg.trainer.batch_size == 16  # file beats the default
    assert cfg.trainer.run_name == ""
    # a mapping override replaces the whole mapping, it is not merged with the file's
    assert cfg.reward.weights == {"correct": 1.0, "format": 0.1}
    assert cfg.data.arithmetic.operators == ["+", "-"]
    assert cfg.data.shuffle is False
    assert cfg.optim.betas == [0.8, 0.95]


def test_override_creates_missing_sections():
    cfg = load_config(None, ["algo.advantage=raw", "rollout.n=1", "trainer.batch_size=3"])
    assert (cfg.algo.advantage, cfg.rollout.n, cfg.trainer.batch_size) == ("raw", 1, 3)


@pytest.mark.parametrize("text, value", [
    ("optim.lr=1e-5", 1e-5),  # the example in `reasonrl train --help`
    ("optim.lr=3E-4", 3e-4),
    ("optim.lr=2.0e-5", 2e-5),
    ("optim.lr=0.001", 0.001),
])
def test_scientific_notation_is_a_number(text, value):
    lr = load_config(None, [text]).optim.lr
    assert type(lr) is float and lr == value


def test_scientific_notation_in_yaml_file(tmp_path):
    path = write(tmp_path, "lr.yaml", "optim:\n  lr: 5e-6\n  eps: 1e-10\n")
    cfg = load_config(path)
    assert (cfg.optim.lr, cfg.optim.eps) == (5e-6, 1e-10)


def test_int_accepted_for_float():
    cfg = load_config(None, ["optim.lr=1", "rollout.temperature=2"])
    assert type(cfg.optim.lr) is float and cfg.optim.lr == 1.0
    assert type(cfg.rollout.temperature) is float and cfg.rollout.temperature == 2.0


def test_number_accepted_for_string():
    assert load_config(None, ["trainer.run_name=42"]).trainer.run_name == "42"


@pytest.mark.parametrize("text, key, value", [
    ("trainer.steps=50", "trainer.steps", 50),
    ("a.b=x=y", "a.b", "x=y"),
    (" optim.lr =0.5", "optim.lr", 0.5),
    ("x=", "x", ""),
    ("x=null", "x", None),
])
def test_parse_override(text, key, value):
    assert parse_override(text) == (key, value)


def test_override_without_equals():
    with pytest.raises(ConfigError, match=r"override 'trainer\.steps': expected dotted\.key=value"):
        parse_override("trainer.steps")


def test_override_with_unparseable_value():
    msg = config_error("data.arithmetic.operators=[+, *]")  # `*` starts a YAML alias
    assert "data.arithmetic.operators=[+, *]" in msg and "cannot parse value" in msg


def test_override_through_a_value_is_an_error():
    msg = config_error("trainer=5", "trainer.steps.x=1")
    assert msg == "trainer.steps.x: 'trainer' is a value, not a section"


# ------------------------------------------------------------------------- unknown keys


def test_unknown_top_level_key():
    msg = config_error("trainr.steps=3")
    assert msg == (f"unknown config key 'trainr' (did you mean 'trainer'?); allowed keys: {SECTIONS}")


def test_unknown_nested_key_names_path_allowed_keys_and_hint():
    msg = config_error("trainer.stepz=3")
    assert msg == (f"unknown config key 'trainer.stepz' (did you mean 'steps'?); "
                   f"allowed keys in trainer: {TRAINER_KEYS}")


def test_unknown_key_without_close_match_has_no_hint():
    msg = config_error("data.arithmetic.qqqqqq=1")
    assert "'data.arithmetic.qqqqqq'" in msg
    assert "did you mean" not in msg
    assert msg.endswith("allowed keys in data.arithmetic: min_operand, max_operand, operators, "
                        "num_operands, train_size, val_size")


def test_unknown_key_in_yaml_file(tmp_path):
    path = write(tmp_path, "bad.yaml", "rollout:\n  temprature: 0.7\n")
    msg = config_error(path=path)
    assert "'rollout.temprature'" in msg and "did you mean 'temperature'?" in msg


# ----------------------------------------------------------------------------- bad values


def test_bad_literal_names_key_and_allowed_values():
    msg = config_error("algo.advantage=foo")
    assert msg == "algo.advantage: 'foo' is not allowed; allowed values: " + ", ".join(ADVANTAGES.names())
    assert ADVANTAGES.names()[:5] == ("raw", "grpo", "grpo_no_std", "dr_grpo", "rloo")


@pytest.mark.parametrize("override, message", [
    ("trainer.steps=abc", "trainer.steps: expected an integer, got 'abc'"),
    ("trainer.steps=true", "trainer.steps: expected an integer, got True"),
    ("trainer.steps=2.5", "trainer.steps: expected an integer, got 2.5"),
    ("optim.lr=[1]", "optim.lr: expected a number, got [1]"),
    ("optim.lr=true", "optim.lr: expected a number, got True"),
    ("data.shuffle=1", "data.shuffle: expected true or false, got 1"),
    ("model.path=[a]", "model.path: expected a string, got ['a']"),
    ("data.arithmetic.operators=+", "data.arithmetic.operators: expected a list, got '+'"),
    ("optim.betas=[0.9, x]", "optim.betas[1]: expected a number, got 'x'"),
    ("reward.weights=[correct]", "reward.weights: expected a mapping, got ['correct']"),
    ("reward.weights={correct: high}", "reward.weights.correct: expected a number, got 'high'"),
    ("trainer=5", "trainer: expected a section (mapping), got 5"),
])
def test_type_errors(override, message):
    assert config_error(override) == message


def test_batch_size_not_multiple_of_n():
    msg = config_error("rollout.n=4", "trainer.batch_size=10")
    assert msg.startswith("trainer.batch_size: 10 completions")
    assert "rollout.n=4" in msg and "multiple of 4" in msg


def test_batch_size_smaller_than_n():
    assert config_error("rollout.n=8", "trainer.batch_size=4").startswith("trainer.batch_size:")


@pytest.mark.parametrize("advantage", ["grpo", "grpo_no_std"])
def test_group_advantage_needs_two_samples(advantage):
    msg = config_error(f"algo.advantage={advantage}", "rollout.n=1", "trainer.batch_size=4")
    assert msg.startswith("rollout.n:") and f"({advantage})" in msg and "n >= 2" in msg


def test_unknown_reward_component_lists_allowed():
    msg = config_error("reward.weights={correct: 1.0, speed: 0.1}")
    assert msg.startswith("reward.weights.speed: unknown reward component")
    assert msg.endswith("allowed: " + ", ".join(REWARD_COMPONENTS.names()))
    assert "correct, format" in msg


def test_empty_reward_weights():
    assert config_error("reward.weights={}").startswith("reward.weights:")


def test_jsonl_task_needs_train_path():
    assert config_error("data.task=jsonl") == "data.train_path: required when data.task=jsonl"
    assert load_config(None, ["data.task=jsonl", "data.train_path=x.jsonl"]).data.train_path == "x.jsonl"


@pytest.mark.parametrize("override, key", [
    ("trainer.steps=0", "trainer.steps"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens"),
    ("rollout.temperature=0", "rollout.temperature"),
    ("rollout.top_p=1.5", "rollout.top_p"),
    ("optim.betas=[0.9]", "optim.betas"),
    ("optim.warmup_ratio=1", "optim.warmup_ratio"),
    ("algo.beta=-0.1", "algo.beta"),
    ("data.arithmetic.num_operands=1", "data.arithmetic.num_operands"),
    ("data.arithmetic.operators=[+, /]", "data.arithmetic.operators"),
])
def test_range_checks_name_their_key(override, key):
    assert re.match(re.escape(key) + r"(\[\d+\])?:", config_error(override))


# ------------------------------------------------- numbers: finite, and the optimizer's ranges


@pytest.mark.parametrize("override, message", [
    ("optim.lr=.inf", "optim.lr: must be finite and in [0, 1], got inf"),
    ("optim.lr=.nan", "optim.lr: must be finite and in [0, 1], got nan"),
    ("optim.lr=-.inf", "optim.lr: must be finite and in [0, 1], got -inf"),
    ("optim.weight_decay=-5", "optim.weight_decay: must be >= 0, got -5.0"),
    ("optim.weight_decay=.nan", "optim.weight_decay: must be finite and >= 0, got nan"),
    ("optim.betas=[2, -1]", "optim.betas[0]: must be in [0, 1), got 2.0"),
    ("optim.betas=[0.9, -1]", "optim.betas[1]: must be in [0, 1), got -1.0"),
    ("optim.betas=[0.9, 1]", "optim.betas[1]: must be in [0, 1), got 1.0"),
    ("optim.betas=[.nan, 0.9]", "optim.betas[0]: must be finite and in [0, 1), got nan"),
    ("optim.eps=-1e-8", "optim.eps: must be >= 0, got -1e-08"),
    ("optim.max_grad_norm=.nan",
     "optim.max_grad_norm: must be finite and > 0, or 0 for no clipping, got nan"),
    ("optim.max_grad_norm=.inf",
     "optim.max_grad_norm: must be finite and > 0, or 0 for no clipping, got inf"),
    ("optim.max_grad_norm=-1", "optim.max_grad_norm: must be > 0, or 0 for no clipping, got -1.0"),
    ("critic.max_grad_norm=-1", "critic.max_grad_norm: must be > 0, or 0 for no clipping, got -1.0"),
    ("algo.entropy_coef=.nan", "algo.entropy_coef: must be a finite number, got nan"),
    ("reward.weights={correct: .inf}", "reward.weights.correct: must be a finite number, got inf"),
])
def test_numbers_must_be_finite_and_in_their_range(override, message):
    """NaN / inf were accepted (optim.lr=.inf died at step 1 as a WeightSyncError, a NaN or negative
    max_grad_norm meant no clipping), bad weight decay and betas reached torch as tracebacks."""
    assert config_error(override) == message


def test_max_grad_norm_zero_still_means_no_clipping():
    cfg = load_config(REPO_ROOT / "configs" / "recipes" / "transparent_grpo_piecewise.yaml")
    assert cfg.optim.max_grad_norm == 0.0  # the recipe's "no gradient-norm clipping"
    assert load_config(None, ["optim.max_grad_norm=0.5"]).optim.max_grad_norm == 0.5
    assert load_config(None, ["optim.betas=[0, 0.999]", "optim.weight_decay=0.1"]).optim.betas == [0.0, 0.999]


def _float_keys(cls: type, prefix: str = "") -> list[tuple[str, str]]:
    """(key path, kind) of every float in the config tree: a float key, a list of floats, a
    mapping of floats (kind "float", "list", "dict")."""
    import typing

    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, path = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            out += _float_keys(tp, path + ".")
        elif tp is float:
            out.append((path, "float"))
        elif typing.get_origin(tp) is list and typing.get_args(tp) == (float,):
            out.append((path, "list"))
        elif typing.get_origin(tp) is dict and typing.get_args(tp)[1] is float:
            keys = f.metadata.get("keys")
            out.append((path + "." + (keys.names()[0] if keys is not None else "name"), "dict"))
    return out


FLOAT_KEYS = _float_keys(Config)


def test_the_walk_finds_every_section_s_floats():
    keys = dict(FLOAT_KEYS)
    assert len(keys) >= 40, keys
    for key in ("optim.lr", "optim.betas", "reward.weights.correct", "placement.policy.resources.name",
                "rollout.vllm.gpu_memory_utilization", "model.lora.alpha", "env.step_timeout", "critic.lr"):
        assert key in keys


@pytest.mark.parametrize("key, kind", FLOAT_KEYS)
@pytest.mark.parametrize("bad", [".nan", ".inf", "-.inf"])
def test_every_float_in_the_config_refuses_nan_and_inf(key, kind, bad):
    if kind == "float":
        override, named = f"{key}={bad}", key
    elif kind == "list":
        override, named = f"{key}=[{bad}]", f"{key}[0]"
    else:
        section, name = key.rsplit(".", 1)
        override, named = f"{section}={{{name}: {bad}}}", key
    msg = config_error(override)
    assert msg.startswith((f"{named}: must be finite and ", f"{named}: must be a finite number")), msg
    assert msg.endswith(f", got {float(bad.replace('.', ''))!r}"), msg


def test_a_non_finite_number_stops_reasonrl_train_with_one_line(capsys):
    code = main(["train", str(REPO_ROOT / "configs" / "smoke.yaml"), "optim.lr=.inf"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err == "reasonrl: config error: optim.lr: must be finite and in [0, 1], got inf\n"


# --------------------------------------------------------------------- include, bad files


def test_include_merges_with_child_overriding(tmp_path):
    write(tmp_path, "base/base.yaml", """
        model: {path: tiny}
        rollout: {n: 4, max_new_tokens: 32, temperature: 0.5}
        trainer: {steps: 7, batch_size: 8}
        data: {arithmetic: {max_operand: 5, operators: ["+", "-"]}}
    """)
    child = write(tmp_path, "runs/child.yaml", """
        include: ../base/base.yaml
        rollout: {max_new_tokens: 8}
        data: {arithmetic: {operators: ["*"]}}
    """)
    cfg = load_config(child, ["trainer.steps=3"])
    assert cfg.model.path == "tiny"
    assert (cfg.rollout.n, cfg.rollout.max_new_tokens, cfg.rollout.temperature) == (4, 8, 0.5)
    assert (cfg.trainer.steps, cfg.trainer.batch_size) == (3, 8)
    assert cfg.data.arithmetic.max_operand == 5  # nested sections merge key by key
    assert cfg.data.arithmetic.operators == ["*"]  # lists are replaced, not concatenated


def test_include_of_missing_file_names_it(tmp_path):
    child = write(tmp_path, "child.yaml", "include: nowhere.yaml\n")
    msg = config_error(path=child)
    assert msg == f"config file {tmp_path / 'nowhere.yaml'} does not exist"


def test_include_cycle_is_an_error(tmp_path):
    loop = write(tmp_path, "loop.yaml", "include: loop.yaml\n")
    assert "include nesting too deep" in config_error(path=loop)


def test_missing_file_names_it(tmp_path):
    path = tmp_path / "absent.yaml"
    assert config_error(path=path) == f"config file {path} does not exist"


def test_malformed_yaml_names_file(tmp_path):
    path = write(tmp_path, "broken.yaml", "trainer:\n  steps: [1, 2\n")
    msg = config_error(path=path)
    assert msg.startswith(f"{path}: invalid YAML")


def test_top_level_must_be_mapping(tmp_path):
    path = write(tmp_path, "list.yaml", "- a\n- b\n")
    assert config_error(path=path) == f"{path}: the top level must be a mapping of sections"


def test_empty_yaml_file_gives_defaults(tmp_path):
    assert load_config(write(tmp_path, "empty.yaml", "# nothing\n")) == Config()


# ---------------------------------------------------------------- shipped configs, dumping


def test_smoke_config_loads():
    cfg = load_config(REPO_ROOT / "configs" / "smoke.yaml")
    assert cfg.model.path == "tiny"
    assert (cfg.trainer.steps, cfg.trainer.batch_size, cfg.rollout.n) == (2, 8, 4)
    assert (cfg.data.arithmetic.train_size, cfg.data.arithmetic.val_size) == (64, 8)


def test_default_config_loads():
    cfg = load_config(REPO_ROOT / "configs" / "default.yaml")
    assert cfg.model.path == ""
    assert (cfg.rollout.n, cfg.trainer.batch_size, cfg.trainer.steps) == (8, 32, 20)
    assert cfg.data.arithmetic.max_operand == 19
    assert cfg.optim.lr == 2e-5


@pytest.mark.parametrize("overrides", [
    [],
    ["reward.weights={correct: 1.0, format: 0.25}", "data.arithmetic.operators=[+, -]",
     "optim.lr=3e-6", "trainer.run_name='x: y'", "data.system_prompt=", "algo.advantage=raw",
     "rollout.n=1", "trainer.batch_size=5"],
])
def test_dump_yaml_round_trips(tmp_path, overrides):
    cfg = load_config(REPO_ROOT / "configs" / "smoke.yaml", overrides)
    text = dump_yaml(cfg)
    assert yaml.safe_load(text)["model"]["path"] == "tiny"
    path = tmp_path / "resolved.yaml"
    path.write_text(text)
    again = load_config(path)
    assert again == cfg
    assert dump_yaml(again) == text


# ---------------------------------------------------------------------------------- CLI


def test_cli_unknown_key_exits_2_and_names_path(capsys):
    code = main(["train", str(REPO_ROOT / "configs" / "smoke.yaml"), "trainer.stepz=3"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert captured.err.startswith("reasonrl: config error: unknown config key 'trainer.stepz'")
    assert "did you mean 'steps'?" in captured.err


def test_cli_print_config(capsys):
    code = main(["train", str(REPO_ROOT / "configs" / "smoke.yaml"), "trainer.steps=9",
                 "--print-config"])
    out = capsys.readouterr().out
    assert code == 0
    assert re.search(r"^  path: tiny$", out, flags=re.M)
    tree = yaml.safe_load(out)
    assert tree["trainer"]["steps"] == 9
    assert tree["trainer"]["run_name"] == "smoke"


def test_cli_overrides_without_config_file(capsys):
    assert main(["train", "trainer.steps=4", "model.path=tiny", "--print-config"]) == 0
    tree = yaml.safe_load(capsys.readouterr().out)
    assert tree["trainer"]["steps"] == 4 and tree["model"]["path"] == "tiny"


# ---- placement.device -------------------------------------------------------------------


def test_device_auto_is_the_default_and_resolves_to_cpu_without_a_gpu(monkeypatch):
    import torch

    from reasonrl.config import resolve_device

    assert load_config().placement.device == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cuda:1") == "cuda:1"


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_device_without_a_gpu_is_refused(monkeypatch, device):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    message = f"placement.device: {device} requested but torch.cuda.is_available() is False"
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, [f"placement.device={device}"])


def test_cuda_index_beyond_the_gpus_is_refused(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert load_config(None, ["placement.device=cuda:0"]).placement.device == "cuda:0"
    message = "placement.device: cuda:1 requested but torch sees 1 GPU"
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, ["placement.device=cuda:1"])


@pytest.mark.parametrize(("overrides", "message"), [
    (["placement.device=gpu"],
     "placement.device: 'gpu' is not allowed; allowed values: auto, cpu, cuda, cuda:N"),
    (["placement.device=cuda:x"], "placement.device: 'cuda:x' is not allowed"),
    (["placement.device=cpu", "placement.mode=ray"],
     "placement.device: cpu is only used with placement.mode=local"),
])
def test_bad_device_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides)


def test_local_workers_live_on_the_configured_device(monkeypatch):
    """placement.device=cpu (and auto on a machine without a GPU): the policy, the engine's
    model and, with LoRA, the engine's own copy are on the CPU."""
    import torch

    from reasonrl.placement import build_workers

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    lora = ["model.path=tiny", "placement.device=cpu", "model.lora.rank=2"]
    cases = [["model.path=tiny"]] + [lora] * HAS_PEFT  # the LoRA case needs peft
    for overrides in cases:
        workers = build_workers(load_config(None, overrides))
        for model in (workers.policy.model, workers.rollout.engine.model):
            assert {p.device.type for p in model.parameters()} == {"cpu"}
        assert workers.policy.device.type == "cpu"


# ------------------------------------------------------- issue 17: reward, data, eval, trainer keys


@pytest.mark.parametrize("overrides, needle", [
    (["reward.gate=[format]"], "reward.gate: 'format' is not in reward.weights, so it is not computed"),
    (["reward.gate=[formatt]"], "reward.gate.formatt: unknown reward component"),
    (["reward.combine=product"], "reward.combine: 'product' is not allowed; allowed values: sum, all, gdpo"),
    (["reward.combine=gdpo", "rollout.n=1", "algo.advantage=reinforce_pp"],
     "reward.combine=gdpo: normalises each component within a prompt's group, which needs rollout.n >= 2"),
    (["reward.fn=a:b", "reward.batch_fn=c:d"], "reward.fn and reward.batch_fn: set one"),
    (["reward.batch_fn=nocolon"], "reward.batch_fn: expected module:function"),
    (["reward.countdown_rule=tinyzer0"], "reward.countdown_rule: 'tinyzer0' is not allowed (did you mean "
                                         "'tinyzero'?); allowed values: subset, tinyzero"),
    (["reward.piecewise_rule=regex"], "allowed values: transparent_grpo, partial_credit"),
    (["data.truncate_prompts=right"], "data.truncate_prompts: 'right' is not allowed; allowed values: "
                                      "error, left"),
    (["trainer.epochs=-1"], "trainer.epochs: must be >= 0, got -1.0"),
    (["eval.top_p=0"], "eval.top_p: must be in (0, 1], got 0.0"),
    (["eval.temperature=-0.5"], "eval.temperature: must be >= 0"),
    (["eval.n=3"], "eval.n: greedy evaluation (eval.temperature=0) gives n identical samples"),
])
def test_new_keys_are_checked_at_start_up(overrides, needle):
    assert needle in config_error(*overrides)


def test_new_keys_default_to_todays_behaviour():
    cfg = load_config(None)
    assert (cfg.reward.combine, cfg.reward.gate, cfg.reward.batch_fn) == ("sum", [], "")
    assert (cfg.reward.countdown_rule, cfg.reward.piecewise_rule) == ("subset", "partial_credit")
    assert (cfg.data.truncate_prompts, cfg.trainer.epochs) == ("error", 0.0)
    assert cfg.optim.gradient_checkpointing is False
    assert (cfg.eval.n, cfg.eval.temperature, cfg.eval.k, cfg.eval.max_new_tokens) == (1, 0.0, [], 0)
    ok = load_config(None, ["reward.weights={correct: 1, format_r1_zero: 0}", "reward.gate=[format_r1_zero]",
                            "reward.combine=all", "eval.n=4", "eval.temperature=0.6", "eval.k=[1, 4]"])
    assert ok.reward.gate == ["format_r1_zero"] and ok.eval.k == [1, 4]


def test_every_config_section_has_its_rules_and_engine_rules_come_from_the_engines(monkeypatch):
    """`rules.RULES` holds one function per section, in the config's order; a rule about the
    rollout engine reads the engine's ENGINES entry, so a new engine brings its own answers."""
    from helpers import patch_entry

    from reasonrl.config import RULES
    from reasonrl.registry import ENGINES

    sections = [f.name for f in dataclasses.fields(Config) if f.name != "tracking"]
    assert [rules.__name__ for rules in RULES] == [f"{name}_rules" for name in sections]
    for entry in ENGINES:
        assert isinstance(entry.tensor_parallel, bool), entry.name
        assert entry.max_model_len(load_config().rollout)[0] == 0, entry.name  # default: none
    two = ["rollout.vllm.tensor_parallel_size=2"]
    with pytest.raises(ConfigError, match="tensor_parallel_size: 2 is vLLM's; rollout.engine=hf runs on one"):
        load_config(None, two)
    hf = ENGINES["hf"]  # an engine that spreads over GPUs accepts the size
    patch_entry(monkeypatch, ENGINES, "hf", hf.fn, tensor_parallel=True)
    assert load_config(None, two).rollout.vllm.tensor_parallel_size == 2


def test_rollout_threads_need_the_rollout_process_of_asynchronous_training():
    """rollout.threads are the torch threads of the rollout process, which only trainer.max_staleness > 0
    starts: set without it they would do nothing (tests/source/test_async.py runs K > 0 with them)."""
    assert config_error("rollout.threads=2") == (
        "rollout.threads: 2 threads of the rollout process, which only asynchronous training runs "
        "(trainer.max_staleness > 0); with trainer.max_staleness=0 the rollout runs in the trainer's "
        "process on trainer.threads: remove rollout.threads or set trainer.max_staleness")
    assert load_config(None, ["rollout.threads=2", "trainer.max_staleness=1"]).rollout.threads == 2
    assert load_config(None, ["trainer.max_staleness=1"]).rollout.threads == 0  # 0: half the cores


def test_sft_records_come_from_files_or_the_solver_not_both():
    assert load_config(None, ["sft.source=files", "sft.train_path=a.jsonl"]).sft.train_path == "a.jsonl"
    assert load_config(None, ["sft.source=solver"]).sft.source == "solver"
    assert config_error("sft.source=solver", "sft.train_path=a.jsonl").startswith(
        "sft.train_path / sft.val_path: read only with sft.source=files; sft.source=solver writes its own")
