"""Shared fixtures: the tiny random SmolLM2-architecture model and the real tokenizer."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REPO_ROOT = Path(__file__).parent.parent


def _test_home() -> Path:
    """A `$REASONRL_HOME` of this test process's own, deleted when it exits: the suite never
    writes the user's home (its calibrations, measured on the tiny model under the suite's load,
    would otherwise be read by a later real run). Its `models` and `tokenizers` are shared: the
    user's converted default model where it is there (only read), else a cache in this
    checkout's .pytest_cache (converted once per checkout, not once per test process)."""
    home = Path(tempfile.mkdtemp(prefix="reasonrl-test-home-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    user = Path(os.environ.get("REASONRL_HOME", Path.home() / ".cache" / "reasonrl"))
    shared = REPO_ROOT / ".pytest_cache" / "reasonrl-home"
    for name in ("models", "tokenizers"):
        source = user / name if (user / name / "SmolLM2-135M-Instruct").is_dir() else shared / name
        source.mkdir(parents=True, exist_ok=True)
        (home / name).symlink_to(source, target_is_directory=True)
    return home


os.environ["REASONRL_HOME"] = str(_test_home())  # before reasonrl reads it

from reasonrl.model.load import build_tiny_model  # noqa: E402

# The files that take longest, longest first (seconds in one process on 2 cores, from a junit
# report of the whole suite): `make test` runs the suite in pytest-xdist workers that each take a
# whole file at a time (--dist loadfile) in collection order, so these start at once and the short
# files fill in around them (longest first: the classic greedy schedule). The other files keep
# their order; a name no longer here is skipped over.
LONGEST_FIRST = [
    "e2e/test_docs.py",  # 416 s
    "source/test_async.py",  # 300
    "placement/test_placement.py",  # 197
    "e2e/test_algo_grid.py",  # 150
    "e2e/test_golden.py",  # 116
    "source/test_async_signals.py",  # 107
    "checkpoint/test_checkpoint.py",  # 92
    "checkpoint/test_run_dir.py",  # 81
    "placement/test_placement_logprobs.py",  # 72
    "e2e/test_judges.py",  # 67
    "rewards/test_model_reward.py",  # 64
    "e2e/test_e2e.py",  # 62
    "workers/test_policy_worker.py",  # 61
    "serve/test_agent_training.py",  # 59
    "e2e/test_distill_runs.py",  # 58
    "train/test_choices.py",  # 55
    "rewards/test_failures.py",  # 53
    "checkpoint/test_resume_changes.py",  # 52
    "tools/test_tools.py",  # 47
    "envs/test_verifiers_agent.py",  # 45
    "evaluate/test_eval.py",  # 41
]


# The files whose tests start Ray clusters the most: one work unit of pytest-xdist's, so that one
# worker runs them one after the other and two clusters (each with its actors) never share the
# cores; the other workers run the rest meanwhile.
RAY_TOGETHER = ["source/test_async.py", "placement/test_placement.py", "e2e/test_judges.py",
                "e2e/test_distill_runs.py"]


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, absent without it
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile (`make test`) with RAY_TOGETHER's files as one unit, handed out in the
    collection's order (LONGEST_FIRST), not xdist's default of the most tests first."""
    if config.getoption("dist") != "loadfile":
        return None
    config.option.loadscopereorder = False
    from xdist.scheduler import LoadFileScheduling

    class RayFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "ray" if path.removeprefix("tests/") in RAY_TOGETHER else path

    return RayFilesTogether(config, log)


def pytest_collection_modifyitems(session, config, items):
    """LONGEST_FIRST's files first, in its order; a file's tests stay together and in order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    tests = Path(__file__).parent

    def key(item) -> int:
        try:
            return rank.get(item.path.relative_to(tests).as_posix(), len(rank))
        except ValueError:  # a test outside tests/ (a path given on the command line)
            return len(rank)

    items.sort(key=key)  # stable


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer) from `build_tiny_model(seed=0)`, shared by the whole session.

    In eval mode, as a loaded model is. Treat it as read-only: a test that changes weights,
    patches kernels in (a policy worker or engine built on it) or adds hooks works on
    `copy.deepcopy(model)`; `_shared_tiny_model_is_left_as_it_was` fails one that does not.
    """
    model, tokenizer = build_tiny_model(seed=0)
    return model.eval(), tokenizer


def model_fingerprint(model) -> tuple:
    """What a test could change in a shared model: its modules, train/eval mode, forwards or
    hooks patched onto instances, the parameters (storage, values, dtype, requires_grad) and
    the config."""
    modules = list(model.modules())
    params = list(model.parameters())
    return (tuple(type(m).__name__ for m in modules), tuple(m.training for m in modules),
            tuple(sorted(k for m in modules for k in vars(m) if k == "forward")),
            sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in modules),
            tuple((p.data_ptr(), p.dtype, p.requires_grad) for p in params),
            float(sum(p.detach().double().sum() for p in params)), repr(model.config))


@pytest.fixture(autouse=True)
def _shared_tiny_model_is_left_as_it_was(request):
    """A test that changes the session's `tiny` model (lean kernels patched in by a worker built
    on it, train mode, weights) changes every later test's: an order-dependent failure. It fails
    here instead, naming itself: build on `copy.deepcopy(model)`."""
    if "tiny" not in request.fixturenames:
        yield
        return
    value = request.getfixturevalue("tiny")
    model = value[0] if isinstance(value, tuple) else value
    before = model_fingerprint(model)
    yield
    changed = [name for name, a, b in zip(("modules", "train/eval mode", "patched forwards", "hooks",
                                            "parameters", "weights", "config"),
                                           before, model_fingerprint(model), strict=True) if a != b]
    assert not changed, f"the shared tiny model was changed ({', '.join(changed)}): use copy.deepcopy(model)"


@pytest.fixture(scope="session")
def tokenizer(tiny):
    """The real SmolLM2 tokenizer (EOS = pad = `<|im_end|>`)."""
    return tiny[1]


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def ray_session():
    """One Ray instance shared by the consecutive tests that ask for it (test_placement,
    test_async, ...): 4 logical CPUs (two policy ranks and two rollout replicas fit), a small
    object store. It is shut down (no process left) as soon as the next test does not ask for it
    (`pytest_runtest_teardown`): an idle cluster's raylet, GCS, log monitor and idle workers
    otherwise stay up beside every later test of that pytest-xdist worker, on 2 cores."""
    ray = pytest.importorskip("ray")  # the dev extra; a GPU machine without it skips these
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        t = time.perf_counter()
        ray.init(num_cpus=4, include_dashboard=False, object_store_memory=200 * 2**20,
                 configure_logging=False, log_to_driver=False)
        print(f"[conftest] ray.init took {time.perf_counter() - t:.1f} s")
    return ray


@pytest.hookimpl(trylast=True)  # after pytest's own teardown: the test's fixtures closed their actors
def pytest_runtest_teardown(item, nextitem):
    """Ray down after the last of a run of tests that asked for `ray_session` (statically or
    through `request.getfixturevalue`): the next one that asks starts it again."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    if nextitem is None or "ray_session" not in getattr(nextitem, "fixturenames", ()):
        ray.shutdown()


# ---- golden runs (tests/e2e/test_golden.py): how many compared with a record of this machine ----

GOLDEN_OUTCOMES: dict[str, str] = {}


def pytest_runtest_logreport(report):
    """Collects each golden run's outcome ("compared" or "no record"), which the test puts in
    its user_properties; under pytest-xdist the reports reach the controller with them."""
    for key, value in getattr(report, "user_properties", ()):
        if key == "golden" and report.when == "call":
            GOLDEN_OUTCOMES[report.nodeid] = value


def pytest_terminal_summary(terminalreporter):
    """One line in the summary (and CI's log): golden runs compared bitwise with this machine's
    record, and those without one (checked by repetition and resume instead)."""
    if GOLDEN_OUTCOMES:
        values = list(GOLDEN_OUTCOMES.values())
        missing = sorted(n.split("[")[-1].rstrip("]") for n, v in GOLDEN_OUTCOMES.items() if v != "compared")
        terminalreporter.write_line(
            f"golden runs: {values.count('compared')} compared bitwise with this machine's record, "
            f"{len(missing)} had no record here{' (' + ', '.join(missing) + ')' if missing else ''}: "
            "those were checked by two straight runs and a resume")
