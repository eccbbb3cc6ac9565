"""Shared fixtures: the tiny random SmolLM2-architecture model and the real tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from reasonrl.policy.model import build_tiny_model

FIXTURES = Path(__file__).parent / "fixtures"
REPO_ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer) from `build_tiny_model(seed=0)`, shared by the whole session.

    Treat the model as read-only: a test that changes weights or adds hooks should work
    on `copy.deepcopy(model)`.
    """
    return build_tiny_model(seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny):
    """The real SmolLM2 tokenizer (EOS = pad = `<|im_end|>`)."""
    return tiny[1]


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
