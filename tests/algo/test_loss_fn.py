"""Out-of-tree policy losses (`algo.loss_fn`, `algo.loss_kwargs`: `reasonrl.workers.policy.policy_loss_fn`):
a loss in a file of its own trains from a config, with its keyword arguments and the `algo`
section's keys; a file, function or signature it cannot use stops the run at start-up naming the
key; the config's rules around the two keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import REPO, keep_torch_threads, smoke_cfg  # noqa: F401 - an autouse fixture

from reasonrl.algo import LossSettings, Totals, policy_objective
from reasonrl.cli import main
from reasonrl.config import AlgoConfig, load_config
from reasonrl.errors import ConfigError
from reasonrl.registry import POLICY_LOSSES
from reasonrl.train.trainer import Trainer
from reasonrl.workers.policy import policy_loss_fn

FIXTURE = REPO / "tests" / "fixtures" / "custom_loss.py"
SCALED = f"algo.loss_fn={FIXTURE}:scaled_surrogate"
# every advantage at least 1, whatever the tiny model samples on this CPU: the reward is 1 + a
# length's residue (never 0) and the advantage the reward itself
POSITIVE = [f"reward.fn={REPO / 'tests' / 'fixtures' / 'length_reward.py'}:positive_length",
            "algo.advantage=raw"]


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_an_out_of_tree_loss_trains_from_the_config(tmp_path):
    """Two steps of the tiny model with the fixture's loss at scale 2: on-policy (rho = 1) it is
    twice the default ppo loss, so step 1's loss is exactly twice that of the same run with ppo
    (doubling is exact in floating point; the batch and weights are the same before the first
    update); its statistics show the keyword it was given and the `algo` key it read.

    The advantages are not left to what the model samples: with GRPO's, a batch whose
    completions all run to max_new_tokens (the tiny model's, nearly always) has a loss of
    -mean(A) = a rounding residue, exactly 0 on an AMD EPYC. Here A = the reward, at least 1
    (`POSITIVE`): the ppo loss -mean(A rho) is at most -1 (rho = 1 up to rounding), on any CPU."""
    Trainer(smoke_cfg(tmp_path, "custom", "trainer.steps=2", SCALED, "algo.loss_kwargs={scale: 2.0}",
                      "algo.clip_low=0.25", *POSITIVE)).fit()
    Trainer(smoke_cfg(tmp_path, "ppo", "trainer.steps=1", "algo.clip_low=0.25", *POSITIVE)).fit()
    custom, ppo = rows(tmp_path / "custom"), rows(tmp_path / "ppo")
    trained = [r for r in custom if "train/loss" in r]
    assert [r["step"] for r in trained] == [1, 2]
    assert trained[0]["train/pg_loss"] < -1.5  # -2 mean(A rho), A >= 1: not 0 by chance
    assert trained[0]["train/pg_loss"] == 2.0 * ppo[-1]["train/pg_loss"]
    assert trained[0]["train/loss"] == 2.0 * ppo[-1]["train/loss"]
    for r in trained:
        assert r["train/scale"] == pytest.approx(2.0, rel=1e-6)  # token shares adding up to 2
        assert r["train/clip_low_seen"] == pytest.approx(0.25, rel=1e-6)
        assert r["train/clamped_frac"] == 0.0
        assert "train/ratio_mean" not in r  # it returned no ratio: none is logged
    assert "train/ratio_mean" in ppo[-1] and "train/scale" not in ppo[-1]


def test_the_keywords_are_bound_and_the_ctx_is_the_algo_section():
    fn = policy_loss_fn(AlgoConfig(loss_fn=f"{FIXTURE}:scaled_surrogate", loss_kwargs={"scale": 3.0}))
    logp, mask = torch.tensor([[-1.0, -2.0]]), torch.ones(1, 2)
    s = LossSettings.of(AlgoConfig(clip_low=0.125))
    loss, stats = fn(logp, logp, torch.tensor([[0.5]]), mask, s)
    assert loss.tolist() == [[-1.5, -1.5]]  # -3 x rho 1 x A 0.5
    assert stats["clip_low_seen"].tolist() == [[0.125, 0.125]]
    # through the objective: token aggregation over the step's 4 tokens, -1.5 x 2 / 4
    total, metrics = policy_objective(logp, logp, torch.tensor([0.5]), mask, s, Totals(4.0, 2.0), loss_fn=fn)
    assert total.item() == -0.75 and metrics["scale"].value == 1.5  # this micro-batch's share
    assert policy_loss_fn(AlgoConfig()) is POLICY_LOSSES.get("ppo")  # no loss_fn: the built-in one


def test_a_module_path_is_imported_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "my_losses_for_test.py").write_text(
        "def reinforce(logp, old_logp, advantages, mask, ctx):\n    return -advantages * logp, {}\n")
    monkeypatch.chdir(tmp_path)
    fn = policy_loss_fn(AlgoConfig(loss_fn="my_losses_for_test:reinforce"))
    loss, _ = fn(torch.tensor([[-2.0]]), None, torch.tensor([[1.5]]), None, None)
    assert loss.item() == 3.0


@pytest.mark.parametrize("target, kwargs, why", [
    ("nowhere/losses.py:fn", {}, "FileNotFoundError: nowhere/losses.py: no such file"),
    (f"{FIXTURE}:missing", {}, "AttributeError: "),
    (f"{FIXTURE}:two_arguments", {}, "TypeError: a policy loss must accept (logp, old_logp, advantages, "
                                     "mask, ctx): "),
    (f"{FIXTURE}:scaled_surrogate", {"tau": 1.0}, "TypeError: a policy loss must accept (logp, old_logp, "
                                                  "advantages, mask, ctx) and the keywords of "
                                                  "algo.loss_kwargs (tau): "),
    ("no_such_module_for_reasonrl:fn", {}, "ModuleNotFoundError: "),
])
def test_a_loss_it_cannot_use_is_a_config_error_naming_the_key(target, kwargs, why):
    with pytest.raises(ConfigError) as info:
        policy_loss_fn(AlgoConfig(loss_fn=target, loss_kwargs=kwargs))
    assert str(info.value).startswith(f"algo.loss_fn: cannot use {target!r}: {why}"), str(info.value)


def test_reasonrl_train_stops_at_start_up_with_one_line_and_writes_nothing(tmp_path, capsys):
    code = main(["train", str(REPO / "configs" / "smoke.yaml"), f"trainer.output_dir={tmp_path}",
                 "model.path=tiny", "trainer.progress=false", f"algo.loss_fn={FIXTURE}:missing"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"reasonrl: config error: algo.loss_fn: cannot use '{FIXTURE}:missing': "
                          "AttributeError: ") and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())  # no run directory


@pytest.mark.parametrize("overrides, message", [
    (["algo.loss_kwargs={scale: 2}"], "algo.loss_kwargs: ['scale'] are keyword arguments of an out-of-tree "
                                      "loss (algo.loss_fn), which is not set; a built-in loss reads its "
                                      "hyper-parameters from algo.* keys"),
    (["algo.loss_fn=losses.py"], "algo.loss_fn: expected module:function or path/file.py:function, got "
                                 "'losses.py'"),
    (["algo.loss_fn=losses.py:fn", "algo.policy_loss=cispo"],
     "algo.loss_fn and algo.policy_loss: set one (algo.loss_fn='losses.py:fn' replaces the built-in "
     "algo.policy_loss='cispo')"),
])
def test_the_rules_of_the_two_keys(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert str(info.value) == message


def test_loss_kwargs_take_any_plain_values_as_given():
    cfg = load_config(None, ["algo.loss_fn=losses.py:fn", "algo.loss_kwargs.scale=2",
                             "algo.loss_kwargs.taus=[1, 1.5]", "algo.loss_kwargs.mode=mean"])
    assert cfg.algo.loss_kwargs == {"scale": 2, "taus": [1, 1.5], "mode": "mean"}
