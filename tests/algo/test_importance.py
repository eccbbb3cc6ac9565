"""reasonrl.algo.importance: the off-policy corrections (`algo.importance_correction`) at each
`algo.importance_level`, hand-computed; their place in the objective; their config keys."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from helpers import loss_settings, patch_entry

from reasonrl.algo import LossSettings, Totals, importance_ratio, importance_weights, policy_objective
from reasonrl.algo.aggregation import aggregate
from reasonrl.config import AlgoConfig, load_config
from reasonrl.errors import ConfigError
from reasonrl.registry import ENGINES, IMPORTANCE_CORRECTIONS, IMPORTANCE_LEVELS, POLICY_LOSSES

# one row of three tokens and a padding position; the padding's engine log-prob is wild, so a
# sequence weight that counted it would be off by e^-7:
#   log rho = old - engine = [0.5, -1.0, ln 3, (-7)],  rho = [e^0.5, e^-1, 3] = [1.6487213, 0.3678794, 3]
#   sequence:  rho_i = exp(0.5 - 1 + ln 3) = 3 e^-0.5 = 1.8195920
#   geometric: rho_i = (3 e^-0.5)^(1/3) = 1.2208379
OLD = [[-1.0, -2.0, -0.5, 0.0]]
ENGINE = [[-1.5, -1.0, -0.5 - math.log(3.0), 7.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
E05, EM1, SEQ, GEO = 1.6487213, 0.3678794, 1.8195920, 1.2208379


def weights(correction: str, level: str = "token", cap: float = 2.0, floor: float = 0.5,
            old=OLD, engine=ENGINE, mask=MASK) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    s = loss_settings(importance_correction=correction, importance_level=level, importance_cap=cap,
                     importance_floor=floor)
    return importance_weights(torch.tensor(old), torch.tensor(engine), mask, s)


def valid(x: torch.Tensor, mask: torch.Tensor = MASK) -> list[float]:
    return x[mask.bool()].float().tolist()


def test_the_registries_and_the_config_choices_are_one_list():
    assert IMPORTANCE_CORRECTIONS.names() == ("none", "tis", "mis", "decoupled")
    assert IMPORTANCE_LEVELS.names() == ("token", "sequence", "geometric")
    fields = {f.name: f for f in dataclasses.fields(AlgoConfig)}
    assert fields["importance_correction"].metadata["choices"] is IMPORTANCE_CORRECTIONS
    assert fields["importance_level"].metadata["choices"] is IMPORTANCE_LEVELS
    algo = AlgoConfig()
    assert (algo.importance_correction, algo.importance_level, algo.importance_cap, algo.importance_floor) \
        == ("none", "token", 2.0, 0.5)
    assert not hasattr(algo, "tis_cap")
    # the settings the objective reads are the config's keys, copied by name
    assert LossSettings.of(dataclasses.replace(algo, importance_correction="mis", importance_cap=3.0)) \
        == loss_settings(importance_correction="mis", importance_cap=3.0)
    for entry in IMPORTANCE_CORRECTIONS:
        assert entry.doc, f"{entry.name} has no docstring"


def test_levels_hand_computed_and_padding_never_enters_a_sequence_weight():
    old, engine = torch.tensor(OLD), torch.tensor(ENGINE)
    assert valid(importance_ratio(old, engine, MASK, "token")) == pytest.approx([E05, EM1, 3.0])
    assert importance_ratio(old, engine, MASK, "sequence").tolist()[0] == pytest.approx([SEQ] * 4)
    assert importance_ratio(old, engine, MASK, "geometric").tolist()[0] == pytest.approx([GEO] * 4)
    # the same row without its padding position: the same sequence weights
    trimmed = (old[:, :3], engine[:, :3], MASK[:, :3])
    assert importance_ratio(*trimmed, "sequence").tolist()[0] == pytest.approx([SEQ] * 3)
    # the brief's two-token example: rho = [e^0.5, e^-1] = [1.6487, 0.3679]; sequence e^-0.5 = 0.6065
    two = (torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), torch.ones(1, 2))
    assert importance_ratio(*two, "token").tolist()[0] == pytest.approx([E05, EM1])
    assert importance_ratio(*two, "sequence").tolist()[0] == pytest.approx([0.6065307] * 2)
    # a row with no valid token: rho = 1 at every level (exp of an empty sum / mean)
    for level in ("sequence", "geometric"):
        assert importance_ratio(old, engine, torch.zeros(1, 4), level).tolist()[0] == [1.0] * 4
    # several rows: one weight per row
    rows = importance_ratio(torch.tensor([OLD[0], [0.0] * 4]), torch.tensor([ENGINE[0], [0.0] * 4]),
                            torch.cat([MASK, torch.ones(1, 4)]), "sequence")
    assert rows[:, 0].tolist() == pytest.approx([SEQ, 1.0])


def test_tis_truncates_at_the_cap():
    """w = min(rho, cap): token [e^0.5, e^-1, min(3, 2)] = [1.6487, 0.3679, 2]; sequence
    min(1.8196, 2) = 1.8196, or 1.5 with cap 1.5 (every token capped)."""
    w, stats = weights("tis")
    assert valid(w) == pytest.approx([E05, EM1, 2.0])
    assert set(stats) == {"is_weight_mean", "is_capped_frac"}
    assert valid(stats["is_capped_frac"]) == [0.0, 0.0, 1.0]  # only rho = 3 exceeded the cap
    assert torch.equal(stats["is_weight_mean"], w)
    w, stats = weights("tis", "sequence")
    assert valid(w) == pytest.approx([SEQ] * 3) and valid(stats["is_capped_frac"]) == [0.0] * 3
    w, stats = weights("tis", "sequence", cap=1.5)
    assert valid(w) == pytest.approx([1.5] * 3) and valid(stats["is_capped_frac"]) == [1.0] * 3
    w, _ = weights("tis", "geometric", cap=1.2)
    assert valid(w) == pytest.approx([1.2] * 3)  # 1.2208 > 1.2


def test_tis_at_token_level_is_bitwise_the_former_truncated_weights():
    old = torch.randn(3, 7, dtype=torch.bfloat16)
    engine = old + 0.3 * torch.randn(3, 7, dtype=torch.bfloat16)
    s = loss_settings(importance_correction="tis", importance_cap=1.3)
    w, _ = importance_weights(old, engine, torch.ones(3, 7), s)
    former = torch.exp(old.detach().float() - engine.detach().float()).clamp(max=1.3)  # the old formula
    assert w.dtype == torch.float32 and torch.equal(w, former)


def test_mis_keeps_rho_inside_floor_and_cap_and_zeroes_the_rest():
    """IcePop's M(rho; 0.5, 2): token [e^0.5, 0 (0.368 < 0.5), 0 (3 > 2)]; sequence 1.8196 kept;
    with cap 1.8 the whole row is masked; with floor 0.4 e^-1 is still out (0.368 < 0.4)."""
    w, stats = weights("mis")
    assert valid(w) == pytest.approx([E05, 0.0, 0.0])
    assert set(stats) == {"is_weight_mean", "is_masked_frac"}
    assert valid(stats["is_masked_frac"]) == [0.0, 1.0, 1.0]
    w, stats = weights("mis", floor=0.3)
    assert valid(w) == pytest.approx([E05, EM1, 0.0])
    w, stats = weights("mis", "sequence")
    assert valid(w) == pytest.approx([SEQ] * 3) and valid(stats["is_masked_frac"]) == [0.0] * 3
    w, stats = weights("mis", "sequence", cap=1.8)
    assert valid(w) == [0.0] * 3 and valid(stats["is_masked_frac"]) == [1.0] * 3
    w, _ = weights("mis", "geometric", floor=1.3, cap=4.0)
    assert valid(w) == [0.0] * 3  # 1.2208 < 1.3


def test_decoupled_masks_above_the_cap_only():
    """AReaL: w = rho if rho <= cap else 0, no lower bound: token [e^0.5, e^-1, 0 (3 > 2)];
    sequence 1.8196 (<= 2) kept, 0 with cap 1.5."""
    w, stats = weights("decoupled")
    assert valid(w) == pytest.approx([E05, EM1, 0.0])
    assert set(stats) == {"is_weight_mean", "is_masked_frac"}
    assert valid(stats["is_masked_frac"]) == [0.0, 0.0, 1.0]
    w, _ = weights("decoupled", floor=0.9)  # the floor is mis's alone
    assert valid(w) == pytest.approx([E05, EM1, 0.0])
    w, _ = weights("decoupled", "sequence")
    assert valid(w) == pytest.approx([SEQ] * 3)
    w, stats = weights("decoupled", "sequence", cap=1.5)
    assert valid(w) == [0.0] * 3 and valid(stats["is_masked_frac"]) == [1.0] * 3


def test_cap_and_floor_are_inclusive():
    """rho = 1 exactly (old = engine): with cap = floor = 1, tis leaves it (not counted as capped),
    mis and decoupled keep it."""
    same = dict(old=[[-0.7, -1.2]], engine=[[-0.7, -1.2]], mask=torch.ones(1, 2))
    for level in IMPORTANCE_LEVELS.names():
        w, stats = weights("tis", level, cap=1.0, **same)
        assert w.tolist() == [[1.0, 1.0]] and not stats["is_capped_frac"].any()
        for correction in ("mis", "decoupled"):
            w, stats = weights(correction, level, cap=1.0, floor=1.0, **same)
            assert w.tolist() == [[1.0, 1.0]] and not stats["is_masked_frac"].any(), (correction, level)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("correction", ["none", "tis", "mis", "decoupled"])
def test_weights_are_detached_constants(correction, level):
    old = torch.tensor(OLD, requires_grad=True)
    engine = torch.tensor(ENGINE, requires_grad=True)
    s = loss_settings(importance_correction=correction, importance_level=level)
    w, stats = importance_weights(old, engine, MASK, s)
    assert w.shape == old.shape and not w.requires_grad and w.grad_fn is None
    assert all(not x.requires_grad and x.shape == old.shape for x in stats.values())
    assert torch.isfinite(w).all()


# ---- in the objective ----------------------------------------------------------------------------

# a row of three tokens and a padding position in a step of 4 tokens, A = 2, PPO clip 0.2:
#   r = exp(logp - old) = [e^0.3, e^-0.2, 1] = [1.3499, 0.8187, 1]
#   ppo_t = -A min(r, clip(r, 0.8, 1.2)) = [-2.4 (clipped), -1.6374615, -2]
#   rho = exp(old - engine) = [e^0.5, e^-1, 3]; decoupled, cap 2: w = [1.6487213, 0.3678794, 0]
#   none:      loss = (-2.4 - 1.6374615 - 2) / 4 = -1.5093654
#   decoupled: loss = (-2.4 * 1.6487213 - 1.6374615 * 0.3678794 + 0) / 4 = -1.1398299
#   gradient (decoupled): [0 (clipped), -A r_2 w_2 / 4 = -0.1505971, 0 (w = 0)]
LOGP = [[-1.0, -2.0, -0.5, 0.0]]
OLD_LOGP = torch.tensor([[-1.3, -1.8, -0.5, 0.0]])
ENGINE_LOGP = torch.tensor([[-1.8, -0.8, -0.5 - math.log(3.0), 5.0]])
STEP = Totals(tokens=4.0, sequences=1.0)


def objective(settings: LossSettings, engine_logp=ENGINE_LOGP, loss_name: str = "ppo"):
    logp = torch.tensor(LOGP, requires_grad=True)
    settings = settings.replace(policy_loss=loss_name)
    loss, metrics = policy_objective(logp, OLD_LOGP, torch.tensor([2.0]), MASK, settings, STEP,
                                     engine_logp=engine_logp)
    loss.backward()
    return loss, {k: m.value for k, m in metrics.items()}, logp.grad


def test_decoupled_ppo_is_the_ppo_loss_times_the_behaviour_weight():
    loss, m, grad = objective(loss_settings(importance_correction="decoupled"))
    assert loss.item() == pytest.approx(-1.1398299, abs=1e-6)
    assert m["pg_loss"] == pytest.approx(-1.1398299, abs=1e-6)
    assert m["is_weight_mean"] == pytest.approx((E05 + EM1) / 4, abs=1e-6)
    assert m["is_masked_frac"] == pytest.approx(1 / 4)
    assert m["logprob_diff_mean"] == pytest.approx((0.5 + 1.0 + math.log(3.0)) / 4)
    assert m["clip_frac"] == pytest.approx(1 / 4)  # the loss's own statistics are unchanged
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.1505971, 0.0, 0.0]]))
    plain, m_plain, _ = objective(loss_settings())
    assert plain.item() == pytest.approx(-1.5093654, abs=1e-6)
    assert "is_weight_mean" not in m_plain and "is_masked_frac" not in m_plain


def test_none_is_bitwise_the_uncorrected_objective():
    """With `none` the engine's log-probs feed the mismatch metrics only: the loss and the
    gradient are bitwise those without engine log-probs (the objective before corrections)."""
    without, m_without, g_without = objective(loss_settings(), engine_logp=None)
    for level in IMPORTANCE_LEVELS.names():
        loss, m, grad = objective(loss_settings(importance_correction="none", importance_level=level))
        assert torch.equal(loss, without) and torch.equal(grad, g_without)
        assert set(m) - set(m_without) == {"logprob_diff_mean", "logprob_diff_max"}
    # a correction without engine log-probs has nothing to weight: no weight at all
    loss, m, _ = objective(loss_settings(importance_correction="tis"), engine_logp=None)
    assert torch.equal(loss, without) and "is_weight_mean" not in m


@pytest.mark.parametrize("loss_name", POLICY_LOSSES.names())
@pytest.mark.parametrize("correction", ["tis", "mis", "decoupled"])
def test_every_correction_composes_with_every_policy_loss(loss_name, correction):
    """objective = agg(loss_t * w_t): the correction multiplies whatever per-token loss is chosen."""
    s = loss_settings(policy_loss=loss_name, importance_correction=correction, importance_level="token")
    loss, _, _ = objective(s, loss_name=loss_name)
    per_token, _ = POLICY_LOSSES.get(loss_name)(torch.tensor(LOGP), OLD_LOGP, torch.tensor([[2.0]]), MASK, s)
    w, _ = importance_weights(OLD_LOGP, ENGINE_LOGP, MASK, s)
    expected = aggregate(per_token * w, MASK, s.loss_agg, STEP.tokens, STEP.sequences, 0.0)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)


# ---- config --------------------------------------------------------------------------------------

def engine_reports_logprobs(monkeypatch, reports: bool) -> None:
    """The `hf` entry with its `logprobs` flag set, whatever the engine does today."""
    entry = ENGINES["hf"]
    patch_entry(monkeypatch, ENGINES, "hf", entry.fn, logprobs=reports)


def test_a_correction_needs_an_engine_that_reports_logprobs(monkeypatch):
    engine_reports_logprobs(monkeypatch, False)
    assert load_config(None, []).algo.importance_correction == "none"  # none needs nothing
    for correction in ("tis", "mis", "decoupled"):
        needle = rf"algo.importance_correction={correction}: needs the sampler's log-probs, which " \
            r"rollout.engine=hf does not report"
        with pytest.raises(ConfigError, match=needle):
            load_config(None, [f"algo.importance_correction={correction}"])
    engine_reports_logprobs(monkeypatch, True)
    for correction in IMPORTANCE_CORRECTIONS.names():
        for level in IMPORTANCE_LEVELS.names():
            algo = load_config(None, [f"algo.importance_correction={correction}",
                                      f"algo.importance_level={level}"]).algo
            assert (algo.importance_correction, algo.importance_level) == (correction, level)


def test_importance_keys_are_checked(monkeypatch):
    engine_reports_logprobs(monkeypatch, True)
    for override, needle in [
            ("algo.importance_correction=is", r"algo.importance_correction: 'is' is not allowed.*"
                                              r"allowed values: none, tis, mis, decoupled"),
            ("algo.importance_level=seq", r"algo.importance_level: 'seq' is not allowed.*"
                                          r"allowed values: token, sequence, geometric"),
            ("algo.importance_cap=0", r"algo.importance_cap: must be > 0, got 0"),
            ("algo.importance_floor=-1", r"algo.importance_floor: must be >= 0, got -1")]:
        with pytest.raises(ConfigError, match=needle):
            load_config(None, [override])
    mis = ["algo.importance_correction=mis", "algo.importance_cap=2"]
    with pytest.raises(ConfigError, match=r"algo.importance_floor: must be < algo.importance_cap=2.0"):
        load_config(None, [*mis, "algo.importance_floor=2"])
    assert load_config(None, [*mis, "algo.importance_floor=1.5"]).algo.importance_floor == 1.5
    # the floor is read by mis alone: tis with a cap below the default floor is fine
    assert load_config(None, ["algo.importance_correction=tis", "algo.importance_cap=0.4"]).algo \
        .importance_cap == 0.4


def test_the_old_tis_cap_key_names_its_replacement(tmp_path):
    with pytest.raises(ConfigError, match=r"algo.tis_cap was replaced by the off-policy corrections .*: "
                                          r"set algo.importance_correction=tis algo.importance_cap=2.0"):
        load_config(None, ["algo.tis_cap=2.0"])
    # a config file of an older run (every dumped config had tis_cap: 0.0, which meant off, as the
    # default importance_correction=none is): it still loads, so the run resumes
    path = Path(tmp_path) / "old.yaml"
    path.write_text("algo:\n  tis_cap: 0.0\n")
    assert load_config(path).algo.importance_correction == "none"
    path.write_text("algo:\n  tis_cap: 1.5\n")
    with pytest.raises(ConfigError, match=r"set algo.importance_correction=tis algo.importance_cap=1.5"):
        load_config(path)
