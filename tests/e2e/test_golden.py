"""Golden runs: 3-step tiny-model runs of the main configurations, whose every `metrics.jsonl`
value (timings and memory aside), final weights and `samples.jsonl` must stay bitwise what they
were when they were recorded. A refactor proves it changed no behaviour by keeping them.

Bitwise holds only on the kind of machine a record was made on: the same CPU (vendor, family,
model, stepping, flags, caches), torch, BLAS and kernel settings (`reasonrl.accel.host.host_kind`:
float32 reductions are ordered differently by other machines' kernels, and a sampled token can
then flip). Each file keeps one record per machine kind (`records`, each with its `host` and
`host_id`); a record of another kind is never compared. On a machine with no record, the test
checks what holds on every machine instead: two straight runs of the configuration are bitwise
equal, and a run stopped after step 2 and resumed equals the straight one. The suite's summary
line says how many golden runs compared with a record and how many had none (conftest).

A change meant to move the numbers bumps `BEHAVIOUR`, re-records what it can and deletes the
records it cannot re-record: `test_every_record_is_of_this_behaviour` fails on a record of an
older behaviour, so a stale record cannot linger. To record (or re-record) this machine's:

    python tests/e2e/test_golden.py            # every run, into tests/golden/<name>.json
    python tests/e2e/test_golden.py grpo ppo   # some of them
    python tests/e2e/test_golden.py --drop-others   # and delete other machines' records

The runs pin what could vary between runs on one machine: one thread, the `lean` decoder (not
the measured `auto` choice), and a reward that varies within groups (the completion's length)
so that every step moves the weights. Two data-parallel ranks are not here: their golden is
one process's run, within the bounds `test_scaling.py::test_two_gloo_ranks_...` states; nor is
vLLM.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
GOLDEN = Path(__file__).parents[1] / "golden"
# The behaviour the records hold. Bump it in the commit whose change moves the numbers (and say
# why), with the records re-made on the machines you have and the others deleted.
BEHAVIOUR = 2
LENGTH_REWARD = "reward.fn=<repo>/tests/fixtures/length_reward.py:length"
COMMON = ["model.path=tiny", "trainer.steps=3", "trainer.threads=1", "trainer.progress=false",
          "trainer.eval_every=0", "trainer.save_every=0", "tracking.report=false", "rollout.hf_decoder=lean",
          LENGTH_REWARD, "reward.isolate_fn=false", "optim.lr=1e-3", "data.arithmetic.val_size=8"]
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
    # frozen models beside the policy: a teacher (distillation, its reverse KL read by a two-epoch
    # update) and a judge (a reward model scoring in its own process); KL in the reward read by a
    # two-epoch update (the policy's no-grad log-probs wanted three ways in one step)
    "distill": ("default.yaml", [*SMALL, "teacher.path=tiny", "teacher.coef=1.0", "teacher.task_weight=1.0",
                                 "optim.ppo_epochs=2"]),
    "judge": ("judge.yaml", [*SMALL, "reward.model.path=tiny", "reward.model.batch_size=8"]),
    "kl_reward_epochs": ("default.yaml", [*SMALL, "algo.beta=0.05", "algo.kl_in=reward", "optim.ppo_epochs=2",
                                          "optim.mini_batches=2"]),
    # asynchronous training (a batch from the policy K versions back), local and ray placement
    "async_k1": ("default.yaml", [*SMALL, "trainer.max_staleness=1"]),
    "async_k2": ("default.yaml", [*SMALL, "trainer.max_staleness=2"]),
    "ray_k0": ("default.yaml", [*SMALL, "placement.mode=ray"]),
    "ray_k1": ("default.yaml", [*SMALL, "placement.mode=ray", "trainer.max_staleness=1"]),
}
NEEDS = {"lora_kl_loss": "peft", "ray_k0": "ray", "ray_k1": "ray"}
# what differs between two runs of one machine: wall-clock timings, memory peaks, waits
VARIES = ("time/", "mem/", "rollout/tokens_per_s", "async/wait", "async/sync_pause", "async/producer_idle")


def host() -> tuple[dict[str, str], str]:
    from reasonrl.accel.host import host_id, host_kind

    return host_kind(), host_id()


def overrides(name: str) -> list[str]:
    return [o.replace("<repo>", str(REPO)) for o in (*COMMON, *RUNS[name][1])]


def start(name: str, out: Path, run_name: str, *extra: str):
    from reasonrl.config import load_config
    from reasonrl.train.trainer import Trainer

    config = RUNS[name][0]
    cfg = load_config(REPO / "configs" / config, [*overrides(name), f"trainer.output_dir={out}",
                                                  f"trainer.run_name={run_name}", *extra])
    return Trainer(cfg)


def tensor_digest(folder: Path) -> str:
    """sha256 over every safetensors tensor under `folder` (the final checkpoint's weights: the
    policy's, a LoRA adapter's, the critic's), by relative path and name, in sorted order."""
    import torch
    from safetensors.torch import load_file

    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.safetensors")):
        for key, tensor in sorted(load_file(path).items()):
            digest.update(f"{path.relative_to(folder)}:{key}:{tensor.dtype}:{list(tensor.shape)}".encode())
            digest.update(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def fingerprint(run: Path) -> dict:
    """What a golden record holds of a finished run: its metrics rows (without what `VARIES`),
    a digest of the final checkpoint's weights and one of `samples.jsonl`."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    metrics = [{k: v for k, v in r.items() if not k.startswith(VARIES)} for r in rows]
    steps = sorted((p for p in (run / "checkpoints").iterdir() if p.name.startswith("step_")),
                   key=lambda p: int(p.name.split("_")[1]))
    samples = hashlib.sha256((run / "samples.jsonl").read_bytes()).hexdigest()
    return {"metrics": metrics, "weights": tensor_digest(steps[-1]), "samples": samples}


def straight(name: str, out: Path, run_name: str | None = None) -> dict:
    """A whole run of `name`, its fingerprint."""
    import torch

    threads = torch.get_num_threads()
    try:
        start(name, out, run_name or name).fit()
    finally:
        torch.set_num_threads(threads)
    return fingerprint(out / (run_name or name))


def stopped_and_resumed(name: str, out: Path) -> dict:
    """`name` stopped by SIGINT after step 2 (its handler saves a checkpoint), then resumed to
    its end in the same folder: the fingerprint of the whole."""
    import torch

    from reasonrl.errors import TrainingInterrupted

    threads = torch.get_num_threads()
    try:
        trainer = start(name, out, "resumed")
        step = trainer.step

        def stepping():
            result = step()
            if trainer.step_count == 2:
                os.kill(os.getpid(), signal.SIGINT)
            return result

        trainer.step = stepping
        with pytest.raises(TrainingInterrupted):
            trainer.fit()
        start(name, out, "resumed", "trainer.resume=auto").fit()
    finally:
        torch.set_num_threads(threads)
    return fingerprint(out / "resumed")


def assert_same(got: dict, want: dict, what: str) -> None:
    rows = len(want["metrics"])
    assert len(got["metrics"]) == rows, f"{what}: {len(got['metrics'])} rows, not {rows}"
    for step, (g, w) in enumerate(zip(got["metrics"], want["metrics"], strict=True)):
        assert g.keys() == w.keys(), f"{what}, row {step}: keys differ: {sorted(set(g) ^ set(w))}"
        changed = {k: (w[k], g[k]) for k in w if g[k] != w[k]}
        assert not changed, f"{what}, row {step}: (expected, now) {changed}"
    assert got["samples"] == want["samples"], f"{what}: samples.jsonl differs"
    assert got["weights"] == want["weights"], f"{what}: the final weights differ"


def records(name: str) -> list[dict]:
    path = GOLDEN / f"{name}.json"
    return json.loads(path.read_text())["records"] if path.exists() else []


def needs(name: str, request) -> None:
    if NEEDS.get(name) and importlib.util.find_spec(NEEDS[name]) is None:
        pytest.skip(f"needs {NEEDS[name]} (pip install 'reasonrl[dev]')")
    if NEEDS.get(name) == "ray":  # the session's one Ray instance (conftest), not one of its own
        request.getfixturevalue("ray_session")


def check_without_record(name: str, tmp_path: Path) -> None:
    """What holds on every machine: two straight runs are bitwise equal, and stop + resume
    equals straight."""
    first = straight(name, tmp_path / "a")
    assert_same(straight(name, tmp_path / "b"), first, f"{name}: a second straight run")
    assert_same(stopped_and_resumed(name, tmp_path / "r"), first, f"{name}: stopped after step 2 and resumed")


@pytest.mark.parametrize("name", list(RUNS))
def test_golden_run_is_unchanged(name, tmp_path, request):
    needs(name, request)
    kind, ident = host()
    golden = next((r for r in records(name) if r["host_id"] == ident), None)
    if golden is None:
        request.node.user_properties.append(("golden", "no record"))
        check_without_record(name, tmp_path)
        return
    request.node.user_properties.append(("golden", "compared"))
    where = golden["host"].get("model_name")
    assert_same(straight(name, tmp_path), golden, f"{name} against its record of {where}")


def test_a_configuration_without_a_record_is_checked_by_repetition_and_resume(tmp_path):
    """The check a machine without records runs, run on every machine (on the one that has
    records too): the default configuration's two straight runs and its resume are bitwise."""
    check_without_record("grpo", tmp_path)


def test_every_record_is_of_this_behaviour_and_complete():
    """A record of an older behaviour (made before a change that moved the numbers) is a stale
    record: the change must re-record it or delete it. Every file is a run of RUNS; every record
    says its machine kind and holds the metrics and both digests."""
    from reasonrl.accel.host import host_id

    assert {p.stem for p in GOLDEN.glob("*.json")} <= set(RUNS)
    for path in sorted(GOLDEN.glob("*.json")):
        ids = []
        for record in json.loads(path.read_text())["records"]:
            where = f"{path.name}, the record of {record.get('host', {}).get('model_name')}"
            assert record.get("behaviour") == BEHAVIOUR, (
                f"{where} holds behaviour {record.get('behaviour')}, this is {BEHAVIOUR}: re-record it "
                f"(python tests/e2e/test_golden.py {path.stem}) or delete it")
            assert record["host_id"] == host_id(record["host"]), f"{where}: host_id is not its host's"
            assert record["metrics"] and len(record["weights"]) == 64 and len(record["samples"]) == 64, where
            ids.append(record["host_id"])
        assert len(ids) == len(set(ids)), f"{path.name}: two records of one machine kind"


def record(names: list[str], drop_others: bool = False) -> None:
    import tempfile

    kind, ident = host()
    GOLDEN.mkdir(exist_ok=True)
    for name in names:
        with tempfile.TemporaryDirectory() as out:
            found = straight(name, Path(out))
        kept = [] if drop_others else [r for r in records(name) if r.get("host_id") != ident
                                       and r.get("behaviour") == BEHAVIOUR]
        kept.append({"behaviour": BEHAVIOUR, "host_id": ident, "host": kind, "config": RUNS[name][0],
                     "overrides": [*COMMON, *RUNS[name][1]], **found})
        (GOLDEN / f"{name}.json").write_text(json.dumps({"records": kept}, indent=1) + "\n")
        print(f"recorded {name}: {len(found['metrics'])} rows, weights {found['weights'][:12]}, "
              f"{len(kept)} record(s) in the file", flush=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--drop-others"]
    record(args or list(RUNS), drop_others="--drop-others" in sys.argv)
