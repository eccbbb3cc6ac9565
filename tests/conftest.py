"""Shared fixtures: the tiny random SmolLM2-architecture model and the real tokenizer."""

from __future__ import annotations

import os
import time
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


@pytest.fixture(scope="session")
def ray_session():
    """One Ray instance for the session (test_placement, test_async): 4 logical CPUs (two
    policy ranks and two rollout replicas fit), a small object store; shut down (no process
    left) at the end."""
    ray = pytest.importorskip("ray")  # the dev extra; a GPU machine without it skips these
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    t = time.perf_counter()
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=200 * 2**20,
             configure_logging=False, log_to_driver=False)
    print(f"[conftest] ray.init took {time.perf_counter() - t:.1f} s")
    yield ray
    ray.shutdown()
