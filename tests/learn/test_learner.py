"""reasonrl.learn.learner: the one learner of the policy and the critic: how metrics combine,
the update loop, the skip rule, optimizer state, the tied-weight loader."""

import copy
import dataclasses
import math
import re

import pytest
import torch

from reasonrl.algo import Metric
from reasonrl.config import CriticConfig, OptimConfig
from reasonrl.learn.learner import Learner, LearnerSettings, copy_weights, merge, summarise
from reasonrl.model.forward import completion_logprobs
from reasonrl.model.load import build_tiny_model

PROMPTS = [[1, 5, 9], [1, 7], [3, 4, 5, 6]]
COMPLETIONS = [[20, 21], [30, 31, 32], [40]]


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model(seed=3)[0]


def test_metrics_combine_by_their_reduction():
    """Over micro-batches: shares add, extremes are extremes; over updates: the mean of shares
    and of per-update values, the extreme of extremes."""
    update: dict[str, Metric] = {}
    for loss, high, low in ((0.25, 1.5, 0.5), (0.5, 1.25, 0.75)):
        merge(update, {"loss": Metric(loss), "ratio_max": Metric(high, "max", 1.0),
                       "ratio_min": Metric(low, "min")})
    assert update == {"loss": Metric(0.75), "ratio_max": Metric(1.5, "max", 1.0),
                      "ratio_min": Metric(0.5, "min")}
    second = {"loss": Metric(0.25), "ratio_max": Metric(2.0, "max"), "ratio_min": Metric(0.25, "min")}
    grad = [{"grad_norm": Metric(1.0, "mean")}, {"grad_norm": Metric(3.0, "mean")}]
    assert summarise([update, second]) == {"loss": 0.5, "ratio_max": 2.0, "ratio_min": 0.25}
    assert summarise(grad) == {"grad_norm": 2.0}
    assert summarise([]) == {}


def learner(model, **optim) -> Learner:
    """The policy's learner at lr 0.1 with a cosine schedule over 3 steps down to half the rate:
    factors 1, 0.75, 0.5 at steps 0, 1, 2 (`reasonrl.learn.schedules.cosine`)."""
    o = OptimConfig(**{"micro_batch_size": 2, "lr": 0.1, "schedule": "cosine", "min_lr_ratio": 0.5, **optim})
    return Learner(model, 0, LearnerSettings.for_policy(o, total_steps=3))


def token_mean_logprob(model):
    """The objective -mean(logp) over the 6 completion tokens, in shares."""
    def objective(mb):
        logp, _ = completion_logprobs(model, mb)
        loss = -(logp * mb.mask).sum() / 6
        valid = logp.detach()[mb.mask.bool()]
        high = valid.max().item() if valid.numel() else -math.inf
        return loss, {"loss": Metric(loss.item()), "logp_max": Metric(high, "max", 1.0)}
    return objective


def test_an_update_steps_once_over_its_micro_batches_and_reports_the_whole_batch(tiny):
    model = copy.deepcopy(tiny)
    one = learner(model, micro_batch_size=8)
    many = learner(copy.deepcopy(tiny), micro_batch_size=1)
    a = one.update(PROMPTS, COMPLETIONS, None, token_mean_logprob(one.model))
    b = many.update(PROMPTS, COMPLETIONS, None, token_mean_logprob(many.model))
    assert a["loss"].value == pytest.approx(b["loss"].value, rel=1e-6)  # shares add up
    assert a["logp_max"].value == pytest.approx(b["logp_max"].value, rel=1e-6)
    assert a["grad_norm"].reduce == "mean" and a["grad_norm"].value > 0 and a["skipped_update"].value == 0.0
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), tiny.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())  # the gradients' memory is gone


def test_a_non_finite_loss_skips_the_step_and_leaves_the_weights(tiny):
    model = copy.deepcopy(tiny)
    worker = learner(model)

    def nan(mb):
        logp, _ = completion_logprobs(model, mb)
        return logp.sum() * float("nan"), {}

    out = worker.update(PROMPTS, COMPLETIONS, None, nan)
    assert out["skipped_update"].value == 1.0
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), tiny.parameters(), strict=True))


def test_an_extreme_no_token_gave_is_its_empty_value(tiny):
    worker = learner(copy.deepcopy(tiny))
    objective = token_mean_logprob(worker.model)
    masked = [[0] * len(c) for c in COMPLETIONS]
    assert worker.update(PROMPTS, COMPLETIONS, masked, objective)["logp_max"] == Metric(1.0, "max", 1.0)


def test_train_runs_epochs_times_mini_batches_updates_and_advances_the_schedule_once(tiny):
    worker = learner(copy.deepcopy(tiny), ppo_epochs=2, mini_batches=2)
    seen = []

    def update(rows):
        seen.append(rows)
        return {"loss": Metric(float(len(rows))), "grad_norm": Metric(float(len(seen)), "mean")}

    metrics, updates = worker.train(3, update)
    assert seen == [[0, 1], [2], [0, 1], [2]] and updates == 4  # contiguous slices, the same each epoch
    assert metrics == {"loss": 1.5, "grad_norm": 2.5}
    assert worker.step == 1 and worker.lr == pytest.approx(0.075)  # 0.1 x the cosine's 0.5 + 0.5 x 0.5


def test_optimizer_state_round_trips(tiny):
    a = learner(copy.deepcopy(tiny))
    a.train(3, lambda rows: a.update([PROMPTS[i] for i in rows], [COMPLETIONS[i] for i in rows], None,
                                     token_mean_logprob(a.model)))
    state = copy.deepcopy(a.state_dict())  # as through a checkpoint file
    assert list(state) == ["optimizer", "scheduler", "step"] and state["step"] == 1
    b = learner(copy.deepcopy(a.model))
    b.load_state_dict(state)
    assert b.step == 1 and b.lr == a.lr
    params = zip(a.optimizer.param_groups[0]["params"], b.optimizer.param_groups[0]["params"], strict=True)
    for p, q in params:
        assert torch.equal(a.optimizer.state[p]["exp_avg"], b.optimizer.state[q]["exp_avg"])


def test_copy_weights_takes_a_tied_tensor_through_its_other_name(tiny):
    model = copy.deepcopy(tiny)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied
    tensors = {k: v.clone() + 1.0 for k, v in tiny.state_dict().items() if k != "lm_head.weight"}
    copy_weights(model, tensors, "checkpoint weights")
    assert torch.equal(model.lm_head.weight, tensors["model.embed_tokens.weight"])
    with pytest.raises(KeyError, match=r"critic weights do not match the model: missing \['model.norm"):
        copy_weights(model, {k: v for k, v in tensors.items() if k != "model.norm.weight"}, "critic weights")
    with pytest.raises(KeyError, match=r"unexpected \['nope'\]"):
        copy_weights(model, {**tensors, "nope": torch.zeros(1)}, "checkpoint weights")


def table() -> dict[str, tuple[set[str], set[str]]]:
    """`LearnerSettings`' docstring table: field -> (the keys its policy cell names, its critic cell's)."""
    rows = {}
    for line in LearnerSettings.__doc__.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("field", "---"):
            keys = [set(re.findall(r"\b(?:optim|critic|trainer)\.\w+", c)) for c in cells[1:]]
            rows[cells[0]] = (keys[0], keys[1])
    return rows


def changed(value):
    """Another value of a config key's type (its range is not checked here)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 3 if isinstance(value, int) else value / 2 + 0.125
    if isinstance(value, list):
        return [x / 2 for x in value]
    return {"constant": "cosine"}.get(value, value + "x")


def test_the_settings_table_says_which_key_each_field_comes_from_for_each_role():
    """Each config key the two builders could read, changed alone, changes exactly the fields whose
    cell names it, for the policy and for the critic: the docstring's table is what they do, and
    what the critic inherits from `optim` is the rows whose critic cell names an `optim` key."""
    rows = table()
    fields = [f.name for f in dataclasses.fields(LearnerSettings)]
    assert sorted(rows) == sorted(fields)
    optim, critic, steps = OptimConfig(), CriticConfig(), 20
    keys = [f"optim.{f.name}" for f in dataclasses.fields(OptimConfig)]
    keys += [f"critic.{f.name}" for f in dataclasses.fields(CriticConfig)] + ["trainer.steps"]

    def built(o, c, t):
        return LearnerSettings.for_policy(o, t), LearnerSettings.for_critic(c, o)

    base = built(optim, critic, steps)
    for key in keys:
        section, name = key.split(".")
        o, c = optim, critic
        if section == "optim":
            o = dataclasses.replace(optim, **{name: changed(getattr(optim, name))})
        elif section == "critic":
            c = dataclasses.replace(critic, **{name: changed(getattr(critic, name))})
        now = built(o, c, changed(steps) if key == "trainer.steps" else steps)
        for role, (before, after) in enumerate(zip(base, now, strict=True)):
            moved = {f for f in fields if getattr(before, f) != getattr(after, f)}
            assert moved == {f for f in fields if key in rows[f][role]}, (key, ("policy", "critic")[role])
    policy, critic_settings = base
    assert (policy.schedule, policy.norm_reduce, critic_settings.schedule, critic_settings.norm_reduce) \
        == ("constant", "mean", None, "max")
    assert critic_settings.micro_batch_size == optim.micro_batch_size  # critic.micro_batch_size=0: inherited
    inherited = sorted(f for f, (_, c) in rows.items() if any(k.startswith("optim.") for k in c))
    assert inherited == ["betas", "eps", "gradient_checkpointing", "lean_kernels",
                         "max_tokens_per_micro_batch", "micro_batch_size", "mini_batches", "ppo_epochs",
                         "share_prompt"]
