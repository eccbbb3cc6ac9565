"""The model's context length at start-up: data.max_prompt_tokens + the tokens after the prompt
must fit the model's max_position_embeddings (reasonrl.config.check_context, read by
reasonrl.placement.model_positions from config.json without loading the model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from reasonrl.cli import main
from reasonrl.config import ConfigError, check_context, load_config
from reasonrl.placement import (
    DEFAULT_POSITIONS,
    TINY_POSITIONS,
    check_model_context,
    model_positions,
    preflight,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(REPO_ROOT / "configs" / "smoke.yaml")


def context_error(positions: int, *overrides: str, source: str = "max_position_embeddings in m/config.json",
                  model: str = "the model") -> str:
    with pytest.raises(ConfigError) as info:
        check_context(load_config(None, list(overrides)), positions, source, model=model)
    return str(info.value)


# ---- the rule (no model) -----------------------------------------------------------------


def test_prompt_plus_new_tokens_longer_than_the_context_names_both_keys_and_the_limit():
    assert context_error(32, "rollout.max_new_tokens=16") == (
        "data.max_prompt_tokens=256 + rollout.max_new_tokens=16 = 272 tokens, more than the model's "
        "context of 32 positions (max_position_embeddings in m/config.json): lower data.max_prompt_tokens "
        "to at most 16, or rollout.max_new_tokens")
    cfg = load_config(None, ["rollout.max_new_tokens=16", "data.max_prompt_tokens=16"])
    check_context(cfg, 32, "x")  # exactly full: fits
    with pytest.raises(ConfigError, match=r"= 33 tokens, more than the model's context of 32 positions"):
        check_context(load_config(None, ["rollout.max_new_tokens=16", "data.max_prompt_tokens=17"]), 32, "x")


def test_new_tokens_that_fill_the_context_alone_say_so():
    assert context_error(32, "rollout.max_new_tokens=40", "data.max_prompt_tokens=8") == (
        "data.max_prompt_tokens=8 + rollout.max_new_tokens=40 = 48 tokens, more than the model's context of "
        "32 positions (max_position_embeddings in m/config.json): the 40 tokens after the prompt alone leave "
        "no room for it: lower rollout.max_new_tokens")


def test_the_held_out_evaluation_s_longer_max_new_tokens_counts():
    assert context_error(100, "data.max_prompt_tokens=50", "rollout.max_new_tokens=40",
                         "eval.max_new_tokens=60").startswith(
        "data.max_prompt_tokens=50 + eval.max_new_tokens=60 = 110 tokens, more than the model's context of "
        "100 positions")


def test_multi_turn_counts_the_observations_and_env_max_total_tokens_caps_them():
    env = ["env.name=feedback", "data.max_prompt_tokens=100", "rollout.max_new_tokens=64",
           "env.max_turns=3", "env.max_observation_tokens=50"]
    assert context_error(200, *env) == (
        "data.max_prompt_tokens=100 + rollout.max_new_tokens=64 + (env.max_turns=3 - 1) x "
        "env.max_observation_tokens=50 = 264 tokens, more than the model's context of 200 positions "
        "(max_position_embeddings in m/config.json): lower data.max_prompt_tokens to at most 36, or "
        "rollout.max_new_tokens, env.max_observation_tokens or env.max_total_tokens")
    check_context(load_config(None, [*env, "env.max_total_tokens=100"]), 200, "x")  # 100 + 100 fits
    assert context_error(150, *env, "env.max_total_tokens=100").startswith(
        "data.max_prompt_tokens=100 + env.max_total_tokens=100 = 200 tokens, more than the model's context "
        "of 150 positions")


def test_a_lower_vllm_max_model_len_is_the_limit():
    msg = context_error(8192, "rollout.engine=vllm", "rollout.vllm.max_model_len=200")
    assert msg == ("data.max_prompt_tokens=256 + rollout.max_new_tokens=64 = 320 tokens, more than "
                   "rollout.vllm.max_model_len=200 (the model's context of 8192 positions "
                   "(max_position_embeddings in m/config.json)): lower data.max_prompt_tokens to at most "
                   "136, or rollout.max_new_tokens")


# ---- where the context is read -----------------------------------------------------------


def save_model(folder: Path, tokenizer, positions: int) -> Path:
    """A tiny random Llama (the tiny test model's shape) with `positions` positions, as an HF folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=positions,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model32(tmp_path_factory, tokenizer):
    return save_model(tmp_path_factory.mktemp("m32") / "m32", tokenizer, 32)


def test_the_constants_agree_with_the_models(tiny):
    model, _ = tiny
    assert model.config.max_position_embeddings == TINY_POSITIONS
    assert model_positions("tiny") == (TINY_POSITIONS, "max_position_embeddings of model.path=tiny")
    assert model_positions("")[0] == DEFAULT_POSITIONS == 8192
    from reasonrl.cache import reasonrl_home
    from reasonrl.model.load import DEFAULT_MODEL_NAME

    converted = reasonrl_home() / "models" / DEFAULT_MODEL_NAME / "config.json"
    if converted.is_file():  # the default model, once converted
        assert json.loads(converted.read_text())["max_position_embeddings"] == DEFAULT_POSITIONS


def test_positions_come_from_config_json(tmp_path, model32):
    assert model_positions(str(model32)) == (32, f"max_position_embeddings in {model32 / 'config.json'}")
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": 1024}))
    assert model_positions(str(gpt2)) == (1024, f"n_positions in {gpt2 / 'config.json'}")
    vlm = tmp_path / "vlm"
    vlm.mkdir()
    (vlm / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 4096}}))
    assert model_positions(str(vlm))[0] == 4096
    none = tmp_path / "none"
    none.mkdir()
    (none / "config.json").write_text("{}")
    assert model_positions(str(none)) is None  # nothing to check against
    (none / "config.json").write_text("[1]")
    model_positions.cache_clear()
    assert model_positions(str(none)) is None


def test_a_hub_config_that_cannot_be_fetched_leaves_it_to_the_model_load(monkeypatch):
    import huggingface_hub

    def offline(*args, **kwargs):
        raise huggingface_hub.errors.LocalEntryNotFoundError("offline")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    assert model_positions("nobody-here/no-such-model-xyz") is None


# ---- start-up: reasonrl train and eval ----------------------------------------------------


def test_reasonrl_train_stops_a_model_with_32_positions_at_start_up(tmp_path, model32, capsys):
    """The tester's case: 32 positions, 16 new tokens. This trained and exited 0 silently."""
    data = tmp_path / "d.jsonl"
    long = "What is " + " + ".join(str(i) for i in range(20)) + "?"
    data.write_text("".join(json.dumps({"prompt": p, "ground_truth": "1"}) + "\n" for p in ["1 + 1?", long]))
    run = [SMOKE, f"model.path={model32}", "rollout.max_new_tokens=16", "data.task=file",
           f"data.train_path={data}", f"trainer.output_dir={tmp_path}", "trainer.progress=false",
           "trainer.steps=1", "tracking.report=false"]
    assert main(["train", *run]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        "reasonrl: config error: data.max_prompt_tokens=256 + rollout.max_new_tokens=16 = 272 tokens, more "
        f"than the model's context of 32 positions (max_position_embeddings in {model32 / 'config.json'}): "
        "lower data.max_prompt_tokens to at most 16, or rollout.max_new_tokens\n")
    assert not (tmp_path / "smoke").exists()  # stopped before the run directory and the model
    # within the context: the prompts over data.max_prompt_tokens are listed with file:line and tokens
    assert main(["train", *run, "data.max_prompt_tokens=16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"reasonrl: error: 2 prompt(s) longer than data.max_prompt_tokens=16: {data}:1 (")
    assert f"; {data}:2 (" in err and " tokens)" in err
    # or cut from the left, as the user chose: every sequence fits the 32 positions
    code = main(["train", *run, "data.max_prompt_tokens=16", "data.truncate_prompts=left"])
    assert code == 0, capsys.readouterr().err
    samples = [json.loads(line) for line in (tmp_path / "smoke" / "samples.jsonl").read_text().splitlines()]
    assert samples


def test_the_default_model_refuses_a_prompt_budget_beyond_its_8192_positions(capsys):
    """The tester's second case: data.max_prompt_tokens=100000 on the 135M model."""
    cfg = load_config(None, ["data.max_prompt_tokens=100000"])
    with pytest.raises(ConfigError) as info:
        preflight(cfg)
    assert str(info.value) == (
        "data.max_prompt_tokens=100000 + rollout.max_new_tokens=64 = 100064 tokens, more than the model's "
        "context of 8192 positions (max_position_embeddings of the default SmolLM2-135M-Instruct): lower "
        "data.max_prompt_tokens to at most 8128, or rollout.max_new_tokens")
    assert main(["train", "data.max_prompt_tokens=100000"]) == 2
    assert capsys.readouterr().err.startswith("reasonrl: config error: data.max_prompt_tokens=100000 + ")


def test_a_critic_path_model_is_checked_too(tmp_path, model32):
    cfg = load_config(None, ["model.path=tiny", "algo.advantage=gae", f"critic.path={model32}",
                             "rollout.max_new_tokens=16"])
    with pytest.raises(ConfigError, match=r"more than critic.path's model's context of 32 positions "
                                          rf"\(max_position_embeddings in {model32}/config.json\)"):
        check_model_context(cfg)


@pytest.mark.parametrize("command, key", [("eval", "eval"), ("probe", "rollout")])
def test_reasonrl_eval_and_probe_check_their_own_max_new_tokens(tmp_path, model32, capsys, command, key):
    """--max-new-tokens: eval's fills the eval section (preflight); probe's only reaches the workers'
    config (build_workers checks it again)."""
    data = tmp_path / "v.jsonl"
    data.write_text(json.dumps({"prompt": "1 + 1?", "ground_truth": "2"}) + "\n")
    code = main([command, "--config", SMOKE, f"model.path={model32}", "data.max_prompt_tokens=24",
                 "rollout.max_new_tokens=8", "--data", str(data), "--max-new-tokens", "12", "--no-progress",
                 "--no-entropy"])
    assert code == 2
    config_json = model32 / "config.json"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"reasonrl: config error: data.max_prompt_tokens=24 + {key}.max_new_tokens=12 = 36 tokens, more "
        f"than the model's context of 32 positions (max_position_embeddings in {config_json}): "
        f"lower data.max_prompt_tokens to at most 20, or {key}.max_new_tokens")
