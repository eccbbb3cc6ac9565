"""Golden runs: 3-step tiny-model runs of the main configurations, whose every `metrics.jsonl`
value (timings and memory aside) must stay bitwise what it was when they were recorded. A
refactor proves it changed no behaviour by keeping them; a change meant to alter the numbers
re-records them in the same commit and says why.

Bitwise holds on the machine kind they were recorded on: the same CPU model, torch and
architecture (float32 reductions are ordered differently by other CPUs' kernels, and a sampled
token can then flip). Each file keeps one record per machine kind (`records`, keyed by the
machine); on a machine with no record the test skips with that reason; record your own first:

    python tests/e2e/test_golden.py            # every run, into tests/golden/<name>.json
    python tests/e2e/test_golden.py grpo ppo   # some of them

The runs pin what could vary between runs on one machine: one thread, the `lean` decoder (not
the measured `auto` choice), and a reward that varies within groups (the completion's length)
so that every step moves the weights. Two data-parallel ranks are not here: their golden is
one process's run, within the bounds `test_scaling.py::test_two_gloo_ranks_...` states; and
vLLM (DAPO with truncated importance sampling) only where it is installed, which the recorder
notes.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
GOLDEN = Path(__file__).parents[1] / "golden"
COMMON = ["model.path=tiny", "trainer.steps=3", "trainer.threads=1", "trainer.progress=false",
          "trainer.eval_every=0", "trainer.save_every=0", "tracking.report=false", "rollout.hf_decoder=lean",
          f"reward.fn={REPO / 'tests' / 'fixtures' / 'length_reward.py'}:length", "reward.isolate_fn=false",
          "optim.lr=1e-3", "data.arithmetic.val_size=8"]
SMALL = ["trainer.batch_size=8", "rollout.n=4", "rollout.max_new_tokens=16"]
RUNS: dict[str, tuple[str, list[str]]] = {
    "grpo": ("default.yaml", SMALL),
    "ppo": ("ppo.yaml", ["trainer.batch_size=8", "rollout.max_new_tokens=16", "critic.warmup_steps=1"]),
    "tool": ("tool_calculator.yaml", ["trainer.batch_size=8", "rollout.n=4", "eval.n=1",
                                      "data.arithmetic.val_size=4"]),
    "lora_kl_loss": ("default.yaml", [*SMALL, "model.lora.rank=4", "algo.beta=0.1", "algo.kl_in=loss",
                                      "algo.entropy_coef=0.01"]),
    "gspo_kl_reward": ("default.yaml", [*SMALL, "algo.ratio_level=sequence", "algo.loss_agg=sequence",
                                        "algo.beta=0.05", "algo.kl_in=reward", "algo.kl_estimator=k1"]),
    "dapo": ("default.yaml", [*SMALL, "algo.dynamic_sampling=true", "algo.clip_high=0.28",
                              "algo.overlong_buffer=4", "optim.ppo_epochs=2",
                              "optim.mini_batches=2"]),
    # asynchronous training (a batch from the policy K versions back), local and ray placement
    "async_k1": ("default.yaml", [*SMALL, "trainer.max_staleness=1"]),
    "async_k2": ("default.yaml", [*SMALL, "trainer.max_staleness=2"]),
    "ray_k0": ("default.yaml", [*SMALL, "placement.mode=ray"]),
    "ray_k1": ("default.yaml", [*SMALL, "placement.mode=ray", "trainer.max_staleness=1"]),
}
NEEDS = {"lora_kl_loss": "peft", "ray_k0": "ray", "ray_k1": "ray"}


def machine() -> dict[str, str]:
    import torch

    from reasonrl.accel.calibrate import cpu_model

    return {"cpu": cpu_model(), "arch": platform.machine(), "torch": torch.__version__}


def run(name: str, out: Path) -> list[dict]:
    """The run's metrics.jsonl rows without wall-clock timings, memory peaks and tokens/s."""
    from reasonrl.config import load_config
    from reasonrl.train.trainer import train

    config, extra = RUNS[name]
    cfg = load_config(REPO / "configs" / config, [*COMMON, *extra, f"trainer.output_dir={out}",
                                                  f"trainer.run_name={name}"])
    train(cfg)
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    varies = ("time/", "mem/", "rollout/tokens_per_s", "async/wait", "async/sync_pause",
              "async/producer_idle")
    return [{k: v for k, v in r.items() if not k.startswith(varies)} for r in rows]


@pytest.mark.parametrize("name", list(RUNS))
def test_golden_run_is_unchanged(name, tmp_path, request):
    import importlib.util

    import torch

    if NEEDS.get(name) and importlib.util.find_spec(NEEDS[name]) is None:
        pytest.skip(f"needs {NEEDS[name]} (pip install 'reasonrl[dev]')")
    if NEEDS.get(name) == "ray":  # the session's one Ray instance (conftest), not one of its own
        request.getfixturevalue("ray_session")
    path = GOLDEN / f"{name}.json"
    records = json.loads(path.read_text())["records"] if path.exists() else []
    golden = next((r for r in records if r["machine"] == machine()), None)
    if golden is None:
        pytest.skip(f"golden runs recorded on {[r['machine'] for r in records]}; this machine is "
                    f"{machine()}: record them here before a refactor (python tests/e2e/test_golden.py)")
    threads = torch.get_num_threads()
    try:
        rows = run(name, tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert len(rows) == len(golden["metrics"])
    for step, (got, want) in enumerate(zip(rows, golden["metrics"], strict=True)):
        assert got.keys() == want.keys(), f"{name}, row {step}: keys differ"
        changed = {k: (want[k], got[k]) for k in want if got[k] != want[k]}
        assert not changed, f"{name}, row {step}: (golden, now) {changed}"


def record(names: list[str]) -> None:
    import tempfile

    GOLDEN.mkdir(exist_ok=True)
    for name in names:
        with tempfile.TemporaryDirectory() as out:
            rows = run(name, Path(out))
        path = GOLDEN / f"{name}.json"
        records = json.loads(path.read_text())["records"] if path.exists() else []
        records = [r for r in records if r["machine"] != machine()]
        records.append({"machine": machine(), "config": RUNS[name][0],
                        "overrides": [*COMMON, *RUNS[name][1]], "metrics": rows})
        path.write_text(json.dumps({"records": records}, indent=1) + "\n")
        print(f"recorded {name}: {len(rows)} rows", flush=True)


if __name__ == "__main__":
    record(sys.argv[1:] or list(RUNS))
