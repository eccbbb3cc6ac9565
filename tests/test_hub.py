"""Models by Hugging Face Hub id, offline: a Hub-cache layout built here from the tiny model
(`models--org--name/refs/main` + `snapshots/<commit>/`, named by huggingface_hub's own
`repo_folder_name`) loads by id with HF_HUB_OFFLINE, for training, `reasonrl eval` and the
vLLM engine; an id that is not cached gets one clear error naming it and the fetch command."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from reasonrl.cli import main
from reasonrl.errors import ModelLoadError
from reasonrl.policy.model import load_model_and_tokenizer, resolve_model_dir

REPO = Path(__file__).parent.parent
REPO_ID = "acme/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub(tmp_path, tiny, monkeypatch) -> Path:
    """An offline Hugging Face cache holding `acme/tiny-llama` (main -> COMMIT, and a tag v1)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    cache = tmp_path / "hf-cache"
    repo = cache / repo_folder_name(repo_id=REPO_ID, repo_type="model")
    snapshot = repo / "snapshots" / COMMIT
    tiny[0].save_pretrained(snapshot)
    tiny[1].save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "refs" / "v1").write_text(COMMIT)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snapshot


def test_a_hub_id_resolves_to_the_cached_snapshot_and_loads(hub, tiny):
    assert resolve_model_dir(REPO_ID) == hub
    assert resolve_model_dir(REPO_ID, revision="v1") == hub
    model, tokenizer = load_model_and_tokenizer(REPO_ID)
    reference = dict(tiny[0].named_parameters())
    assert all(torch.equal(p, reference[n]) for n, p in model.named_parameters())
    assert tokenizer.eos_token == tiny[1].eos_token


def test_an_uncached_id_offline_names_the_id_and_the_command(hub):
    with pytest.raises(ModelLoadError, match=r"model.path=acme/other: not in the Hugging Face cache .* "
                                             r"HF_HUB_OFFLINE is set; fetch it once with "
                                             r"`hf download acme/other`"):
        resolve_model_dir("acme/other")
    with pytest.raises(ModelLoadError, match=r"acme/tiny-llama at revision v2: not in the Hugging Face "
                                             r"cache"):
        resolve_model_dir(REPO_ID, revision="v2")


def test_a_local_folder_wins_over_a_hub_id_of_the_same_name(hub, tmp_path, monkeypatch, tiny):
    monkeypatch.chdir(tmp_path)
    tiny[0].save_pretrained(tmp_path / "acme" / "tiny-llama")
    assert resolve_model_dir(REPO_ID) == Path("acme/tiny-llama")


def test_training_and_eval_by_hub_id(hub, tmp_path, capsys):
    assert main(["train", str(REPO / "configs" / "smoke.yaml"), f"model.path={REPO_ID}", "trainer.steps=1",
                 f"trainer.output_dir={tmp_path}", "trainer.run_name=hub", "trainer.progress=false",
                 "tracking.report=false"]) == 0
    assert (tmp_path / "hub" / "checkpoints" / "step_1" / "huggingface" / "model.safetensors").is_file()
    assert main(["eval", "--config", str(REPO / "configs" / "smoke.yaml"), "--model", REPO_ID, "--greedy",
                 "--no-entropy", "--no-progress", "--limit", "2"]) == 0
    assert f"eval of {REPO_ID}" in capsys.readouterr().out
    assert main(["eval", "--config", str(REPO / "configs" / "smoke.yaml"), "--model", "acme/nope",
                 "--no-progress"]) == 2
    assert "hf download acme/nope" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (make vllm)")
def test_the_vllm_engine_serves_a_model_loaded_by_hub_id(hub, tmp_path):
    """vLLM starts from the policy's weights (a folder written from the model loaded by id)."""
    from reasonrl.config import load_config
    from reasonrl.trainer import train

    cfg = load_config(REPO / "configs" / "smoke.yaml", [
        f"model.path={REPO_ID}", "rollout.engine=vllm", "trainer.steps=1", f"trainer.output_dir={tmp_path}",
        "trainer.run_name=v", "trainer.progress=false", "tracking.report=false"])
    assert train(cfg).run_dir == tmp_path / "v"
