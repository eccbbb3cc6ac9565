"""The policy worker: completion log-probs, exact micro-batch normalisation, updates."""

import copy

import pytest
import torch
from helpers import patch_entry, policy_settings

from reasonrl.algo.policy_loss import ppo
from reasonrl.batch import TrainBatch
from reasonrl.learn.learner import Learner
from reasonrl.model.forward import completion_logprobs, layout_tokens, make_micro_batches
from reasonrl.model.load import build_tiny_model
from reasonrl.registry import POLICY_LOSSES
from reasonrl.workers.policy import PolicyWorker

PROMPTS = [[1, 5, 9, 11], [1, 7], [1, 5, 9, 11], [3, 4, 5, 6, 7, 8]]
COMPLETIONS = [[20, 21, 2], [30], [40, 41, 42, 43, 44], [50, 51]]
ADVANTAGES = torch.tensor([1.0, -0.5, 0.25, -1.5])


@pytest.fixture(scope="module")
def base_model():
    model, _ = build_tiny_model(seed=3)
    return model


def naive_logprobs(model, prompt, completion):
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return torch.stack([logp[len(prompt) - 1 + t, tok] for t, tok in enumerate(completion)])


def test_micro_batches_pad_to_their_own_length():
    mbs = make_micro_batches(PROMPTS, COMPLETIONS, size=2, pad_id=0)
    assert sorted(r for mb in mbs for r in mb.rows) == [0, 1, 2, 3]
    # sorted by total length: rows 1 (3 tokens) and 0 (7) together, then 3 (8) and 2 (9)
    assert [mb.rows for mb in mbs] == [[1, 0], [3, 2]]
    assert mbs[0].input_ids.shape == (2, 7) and mbs[1].input_ids.shape == (2, 9)
    assert mbs[0].mask.tolist() == [[1, 0, 0], [1, 1, 1]]


def test_shared_prompt_micro_batches_compute_each_prompt_once():
    mbs = make_micro_batches(PROMPTS, COMPLETIONS, size=3, pad_id=0, share_prompt=True)
    # ordered by prompt length: [1, 7] (row 1), then rows 0 and 2 (same prompt), then row 3
    assert [mb.rows for mb in mbs] == [[1, 0, 2], [3]]
    first = mbs[0]
    assert first.prompts.tolist() == [[1, 7, 0, 0], [1, 5, 9, 11]]  # two distinct prompts, right-padded
    assert first.prompt_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert first.prompt_of_row.tolist() == [0, 1, 1]
    # completion inputs: all but the last token of each row
    assert first.input_ids.tolist() == [[0, 0, 0, 0], [20, 21, 0, 0], [40, 41, 42, 43]]
    assert first.attention_mask.tolist() == [[1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0],
                                             [1, 1, 1, 1, 1, 1, 1, 1]]
    assert first.targets.tolist() == [[30, 0, 0, 0, 0], [20, 21, 2, 0, 0], [40, 41, 42, 43, 44]]
    assert first.mask.tolist() == [[1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]


def test_layout_tokens_count_the_positions_a_micro_batch_runs():
    # totals 7, 3, 9, 8: plain, rows 0 and 2 -> 2 x 9; shared: prompt [1, 5, 9, 11] once (4) + 2 x (5 - 1)
    assert layout_tokens(PROMPTS, COMPLETIONS, [0, 2], share_prompt=False) == 18
    assert layout_tokens(PROMPTS, COMPLETIONS, [0, 2], share_prompt=True) == 4 + 2 * 4
    # three distinct prompts padded to 6, three rows' completion inputs padded to 5 - 1
    assert layout_tokens(PROMPTS, COMPLETIONS, [1, 2, 3], share_prompt=True) == 3 * 6 + 3 * 4


@pytest.mark.parametrize("share_prompt", [False, True], ids=["plain", "shared_prompt"])
@pytest.mark.parametrize("budget", [1, 8, 12, 18, 100])
def test_a_token_budget_bounds_every_micro_batch(share_prompt, budget):
    """No micro-batch runs more positions than the budget, unless it is one row longer than
    the budget; every row is in exactly one; the row cap still holds."""
    mbs = make_micro_batches(PROMPTS, COMPLETIONS, size=3, pad_id=0, share_prompt=share_prompt,
                             max_tokens=budget)
    assert sorted(r for mb in mbs for r in mb.rows) == [0, 1, 2, 3]
    for mb in mbs:
        assert len(mb.rows) <= 3
        # the tensors' size, counted from the shapes, is the layout's count from the lengths
        positions = mb.input_ids.numel() + (0 if mb.prompts is None else mb.prompts.numel())
        assert positions == mb.computed_tokens == layout_tokens(PROMPTS, COMPLETIONS, mb.rows, share_prompt)
        assert positions <= budget or len(mb.rows) == 1


def test_plain_budget_cuts_the_length_sorted_rows_greedily():
    # rows by total length: 1 (3), 0 (7), 3 (8), 2 (9); budget 16: [1, 0] = 2 x 7 = 14, then
    # [3] (adding 2 would be 2 x 9 = 18 > 16), then [2]
    mbs = make_micro_batches(PROMPTS, COMPLETIONS, size=4, pad_id=0, max_tokens=16)
    assert [mb.rows for mb in mbs] == [[1, 0], [3], [2]]
    # a budget the row cap reaches first changes nothing
    assert [mb.rows for mb in make_micro_batches(PROMPTS, COMPLETIONS, size=2, pad_id=0, max_tokens=100)] == \
        [mb.rows for mb in make_micro_batches(PROMPTS, COMPLETIONS, size=2, pad_id=0)]


def test_shared_prompt_budget_orders_by_completion_length_when_that_runs_fewer_positions():
    """Two prompts of 4 tokens, each with a 2- and a 20-token completion. By prompt under a budget
    of 50: [a2, a20] = 4 + 2 x 19 = 42, [b2, b20] = 42: 84 positions. By completion length:
    [a2, b2] = 2 x 4 + 2 x 1 = 10, [a20, b20] = 8 + 2 x 19 = 46: 56 positions, chosen."""
    prompts = [[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8], [5, 6, 7, 8]]
    completions = [[9] * 2, [9] * 20, [9] * 2, [9] * 20]
    mbs = make_micro_batches(prompts, completions, size=4, pad_id=0, share_prompt=True, max_tokens=50)
    assert [mb.rows for mb in mbs] == [[0, 2], [1, 3]]
    # without the budget (or one the rows cap reaches first) the prompt order stays
    assert [mb.rows for mb in make_micro_batches(prompts, completions, size=2, pad_id=0,
                                                 share_prompt=True, max_tokens=1000)] == [[0, 1], [2, 3]]


@pytest.mark.parametrize("share_prompt", [False, True], ids=["plain", "shared_prompt"])
def test_the_greedy_cut_is_its_definition_on_random_rows(share_prompt):
    """`micro_batch_rows` keeps the open chunk's size row by row; it must cut exactly where the
    definition does: before a row whose chunk would pass the row cap or `layout_tokens` > budget."""
    from reasonrl.model.forward import micro_batch_rows

    gen = torch.Generator().manual_seed(0)
    for trial in range(30):
        n = int(torch.randint(1, 25, (1,), generator=gen))
        groups = [[7] * int(torch.randint(1, 9, (1,), generator=gen)) + [trial, g] for g in range(4)]
        prompts = [groups[int(torch.randint(0, 4, (1,), generator=gen))] for _ in range(n)]
        completions = [[5] * int(torch.randint(1, 30, (1,), generator=gen)) for _ in range(n)]
        size = int(torch.randint(1, 9, (1,), generator=gen))
        budget = int(torch.randint(0, 120, (1,), generator=gen))
        chunks = micro_batch_rows(prompts, completions, size, share_prompt, budget)
        assert sorted(r for c in chunks for r in c) == list(range(n))
        for k, chunk in enumerate(chunks):
            tokens = layout_tokens(prompts, completions, chunk, share_prompt)
            assert len(chunk) <= size and (budget == 0 or len(chunk) == 1 or tokens <= budget)
            if k + 1 < len(chunks):  # closed because the next row would not fit
                grown = layout_tokens(prompts, completions, chunk + chunks[k + 1][:1], share_prompt)
                assert len(chunk) == size or grown > budget > 0


def test_layout_metrics_count_micro_batches_and_padding():
    # one plain micro-batch of the four rows: 4 x 9 positions, 7 + 3 + 9 + 8 = 27 real -> 1/4 padding
    mbs = make_micro_batches(PROMPTS, COMPLETIONS, size=4, pad_id=0)
    m = Learner.layout_metrics(mbs)
    assert (m["micro_batches"].value, m["micro_batch_tokens_max"].value) == (1.0, 36.0)
    assert m["pad_fraction"].value == pytest.approx(0.25)
    # shared prompt, rows 0 and 2 (same prompt): 4 + 2 x 4 positions, 4 + (2 + 4) real -> 2/12
    shared = make_micro_batches([PROMPTS[0], PROMPTS[2]], [COMPLETIONS[0], COMPLETIONS[2]], size=2,
                                pad_id=0, share_prompt=True)
    assert Learner.layout_metrics(shared)["pad_fraction"].value == pytest.approx(2 / 12)


@pytest.mark.parametrize("share_prompt", [False, True], ids=["plain", "shared_prompt"])
@pytest.mark.parametrize("size", [1, 3, 4])
def test_completion_logprobs_match_a_plain_forward(base_model, size, share_prompt):
    with torch.no_grad():
        for mb in make_micro_batches(PROMPTS, COMPLETIONS, size=size, pad_id=0, share_prompt=share_prompt):
            logp, entropy = completion_logprobs(base_model, mb, with_entropy=True)
            for j, row in enumerate(mb.rows):
                n = len(COMPLETIONS[row])
                expected = naive_logprobs(base_model, PROMPTS[row], COMPLETIONS[row])
                torch.testing.assert_close(logp[j, :n], expected, rtol=1e-5, atol=1e-5)
                assert (entropy[j, :n] > 0).all()


def test_temperature_scales_logits(base_model):
    mb = make_micro_batches(PROMPTS[:1], COMPLETIONS[:1], size=1, pad_id=0)[0]
    with torch.no_grad():
        hot, _ = completion_logprobs(base_model, mb, temperature=2.0)
        ids = torch.tensor([PROMPTS[0] + COMPLETIONS[0]])
        logits = base_model(input_ids=ids).logits[0] / 2.0
    expected = torch.log_softmax(logits, -1)[[3, 4, 5], COMPLETIONS[0]]
    torch.testing.assert_close(hot[0], expected, rtol=1e-5, atol=1e-5)


def run_train_step(model, micro_batch_size, sgd_lr=None, advantages=ADVANTAGES, loss_mask=None,
                   token_mask=None, **hyper):
    """One `train_step` on a copy of `model`; returns (the gradient at each optimizer step,
    metrics, the worker). lr = 0 unless `sgd_lr`, which swaps AdamW for plain SGD so that
    later steps depend on earlier gradients only linearly (round-off stays round-off)."""
    model = copy.deepcopy(model)
    hyper = {"lr": 0.0, "max_grad_norm": 0.0, **hyper}
    worker = PolicyWorker(model, pad_id=0,
                          settings=policy_settings(micro_batch_size=micro_batch_size, **hyper))
    if worker.ref_model is not None:  # make the reference differ so the KL term has a gradient
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in worker.ref_model.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=gen))
    if sgd_lr is not None:
        worker.learner.optimizer = torch.optim.SGD(model.parameters(), lr=sgd_lr)
    steps = []
    inner = worker.learner.optimizer.step

    def step(*args, **kwargs):
        steps.append({n: p.grad.clone() for n, p in model.named_parameters()})
        return inner(*args, **kwargs)

    worker.learner.optimizer.step = step
    metrics = worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, advantages, loss_mask,
                                           token_mask=token_mask))
    return steps, metrics, worker


def grads_after_step(model, micro_batch_size, loss_agg, beta=0.0, kl_estimator="k3", **hyper):
    steps, metrics, _ = run_train_step(model, micro_batch_size, loss_agg=loss_agg, beta=beta,
                                       kl_estimator=kl_estimator, **hyper)
    assert len(steps) == 1
    return steps[0], metrics


def assert_grads_close(grads, expected, what):
    """Equal up to float32 round-off: |diff| <= 1e-4 of the tensor's largest entry (measured
    here: <= 6e-6; padding changes the summation order). A wrong normaliser is off by O(1)."""
    for name, g in grads.items():
        scale = expected[name].abs().max().item()
        diff = (g - expected[name]).abs().max().item()
        assert diff <= 1e-4 * scale + 1e-9, f"{what}: {name} differs by {diff} (scale {scale})"


AGGREGATIONS = ["token", "sequence", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
# everything that enters the loss at once: KL in the loss, entropy bonus, dual clip
EXTRAS = {"beta": 0.1, "kl_estimator": "k3", "entropy_coef": 0.01, "clip_ratio_c": 3.0}


@pytest.mark.parametrize("loss_agg", AGGREGATIONS)
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
@pytest.mark.parametrize("extras", [False, True], ids=["plain", "kl+entropy+dual_clip"])
def test_gradient_does_not_depend_on_micro_batch_size(base_model, loss_agg, ratio_level, extras):
    """Micro-batch sizes 1, 2, 3 and the full batch (4), each prompt computed per row or once
    per micro-batch (`share_prompt`), and token budgets that cut the rows differently (1: a row
    per micro-batch) give the same gradient in every mode (to `assert_grads_close`'s bound)."""
    hyper = dict(loss_agg=loss_agg, ratio_level=ratio_level, max_response_length=8,
                 **(EXTRAS if extras else {}))
    (full,), m_full, _ = run_train_step(base_model, 4, share_prompt=False, **hyper)
    assert max(g.abs().max().item() for g in full.values()) > 1e-3  # a real gradient
    cases = [(1, False, 0), (2, False, 0), (3, False, 0), (1, True, 0), (2, True, 0), (3, True, 0),
             (4, True, 0), (4, False, 10), (4, False, 16), (4, True, 10), (4, True, 16), (4, True, 1)]
    for size, share, budget in cases:
        (grads,), metrics, _ = run_train_step(base_model, size, share_prompt=share,
                                              max_tokens_per_micro_batch=budget, **hyper)
        assert_grads_close(grads, full, f"micro_batch_size={size}, share_prompt={share}, max_tokens={budget}")
        for key in ("train/loss", "train/pg_loss", "train/entropy", "train/clip_frac"):
            assert metrics[key] == pytest.approx(m_full[key], rel=1e-5, abs=1e-7), key
        if extras:
            assert metrics["train/kl"] == pytest.approx(m_full["train/kl"], rel=1e-5)


@pytest.mark.parametrize("loss_agg", AGGREGATIONS)
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_gradient_is_invariant_per_optimizer_step_with_mini_batches_and_epochs(
        base_model, loss_agg, ratio_level):
    """2 epochs x 2 mini-batches = 4 optimizer steps, each normalised over its own 2 rows;
    the later steps are off-policy (ratio != 1), and still every step's gradient is the
    same for micro-batch sizes 1, 2 (= the mini-batch) and 4."""
    hyper = dict(loss_agg=loss_agg, ratio_level=ratio_level, max_response_length=8, ppo_epochs=2,
                 mini_batches=2, sgd_lr=0.1)
    full, m_full, _ = run_train_step(base_model, 4, **hyper)
    assert len(full) == 4 and m_full["train/updates"] == 4
    assert abs(m_full["train/ratio_max"] - 1) > 1e-3 or abs(m_full["train/ratio_min"] - 1) > 1e-3
    for size in (1, 2):
        steps, metrics, _ = run_train_step(base_model, size, **hyper)
        for k, (grads, expected) in enumerate(zip(steps, full, strict=True)):
            assert_grads_close(grads, expected, f"micro_batch_size={size}, optimizer step {k}")
        assert metrics["train/loss"] == pytest.approx(m_full["train/loss"], rel=1e-4, abs=1e-7)


def test_mini_batch_invariance_with_kl_entropy_and_dual_clip(base_model):
    """The precomputed reference log-probs (several updates) are laid out per micro-batch right."""
    m_full = assert_micro_batch_invariant(base_model, ppo_epochs=2, mini_batches=2, sgd_lr=0.5, **EXTRAS)
    assert m_full["train/kl"] > 0


def assert_micro_batch_invariant(base_model, **hyper) -> dict[str, float]:
    """Every optimizer step's gradient, and train/kl, the same for micro-batch sizes 1 and 2 as
    for 4 (the whole batch); the metrics of size 4."""
    full, m_full, _ = run_train_step(base_model, 4, **hyper)
    for size in (1, 2):
        steps, metrics, _ = run_train_step(base_model, size, **hyper)
        for k, (grads, expected) in enumerate(zip(steps, full, strict=True)):
            assert_grads_close(grads, expected, f"micro_batch_size={size}, optimizer step {k}")
        assert metrics["train/kl"] == pytest.approx(m_full["train/kl"], rel=1e-4)
    return m_full


def hand_written_objective(model, loss_agg, advantages=ADVANTAGES, max_len=8, old=None, clip=0.2,
                           ratio_level="token", masks=None):
    """The step's loss written out row by row from naive log-probs: PPO-clip per token (or
    per sequence for GSPO), then the aggregation's normaliser over the whole batch. `masks`
    (multi-turn): 1 on the model's tokens; each row's forward sees every token (the
    environment's as context), the sums and normalisers count only the masked ones."""
    masks = masks or [[1] * len(c) for c in COMPLETIONS]
    n, total_tokens = len(PROMPTS), sum(sum(m) for m in masks)
    objective = 0.0
    for i, (p, c, a, m) in enumerate(zip(PROMPTS, COMPLETIONS, advantages, masks, strict=True)):
        logp = naive_logprobs(model, p, c)[torch.tensor(m, dtype=torch.bool)]
        old_i = logp.detach() if old is None else old[i]
        log_ratio = logp - old_i
        if ratio_level == "sequence":  # GSPO-token: value s_i, gradient s_i * grad logp_t
            log_ratio = logp - logp.detach() + log_ratio.mean().detach()
        ratio = torch.exp(log_ratio)
        per_token = torch.maximum(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip))
        objective = objective + {
            "token": per_token.sum() / total_tokens,
            "sequence": per_token.mean() / n,
            "seq_mean_token_sum": per_token.sum() / n,
            "seq_mean_token_sum_norm": per_token.sum() / (n * max_len),
        }[loss_agg]
    return objective


def model_grads(model, objective):
    objective.backward()
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("loss_agg", AGGREGATIONS)
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_gradient_equals_the_hand_written_objective(base_model, loss_agg, ratio_level):
    """On-policy the loss is -sum A_i logp_it / normaliser (GSPO's too: s_i = 1 and
    d s_i = mean_t d logp_it); compare to autograd of that, written row by row."""
    grads, _ = grads_after_step(base_model, 2, loss_agg, ratio_level=ratio_level, max_response_length=8)
    model = copy.deepcopy(base_model)
    expected = model_grads(model, hand_written_objective(model, loss_agg, ratio_level=ratio_level))
    assert_grads_close(grads, expected, "hand-written")


@pytest.mark.parametrize(("loss_agg", "ratio_level"), [("token", "token"), ("sequence", "sequence")])
def test_second_epoch_gradient_equals_the_off_policy_ppo_objective(base_model, loss_agg, ratio_level):
    """ppo_epochs=2 with SGD: the second update's gradient is that of the clipped objective
    at the once-updated weights with ratios against the ORIGINAL weights' log-probs."""
    lr = 2.0
    steps, metrics, _ = run_train_step(base_model, 2, sgd_lr=lr, loss_agg=loss_agg,
                                       ratio_level=ratio_level, ppo_epochs=2)
    with torch.no_grad():
        old = [naive_logprobs(base_model, p, c) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    moved = copy.deepcopy(base_model)
    with torch.no_grad():
        for name, p in moved.named_parameters():
            p.sub_(lr * steps[0][name])
    expected = model_grads(moved, hand_written_objective(moved, loss_agg, old=old, ratio_level=ratio_level))
    assert_grads_close(steps[1], expected, "second epoch")
    assert metrics["train/ratio_max"] > 1.01  # the second update is really off-policy


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_in_loss_gradient_for_each_estimator(base_model, estimator):
    """loss = pg + beta * token_mean(k(logp, ref)); compare to autograd of that, written out."""
    beta = 0.5
    grads, metrics = grads_after_step(base_model, 3, "token", beta=beta, kl_estimator=estimator)
    _, _, worker = run_train_step(base_model, 3, beta=beta, kl_estimator=estimator)
    model = copy.deepcopy(base_model)
    total_tokens = sum(len(c) for c in COMPLETIONS)
    objective, kl_total = hand_written_objective(model, "token"), 0.0
    for p, c in zip(PROMPTS, COMPLETIONS, strict=True):
        logp = naive_logprobs(model, p, c)
        with torch.no_grad():
            ref = naive_logprobs(worker.ref_model, p, c)
        kl = {"k1": logp - ref, "k2": 0.5 * (logp - ref) ** 2,
              "k3": torch.exp(ref - logp) - (ref - logp) - 1}[estimator]
        objective = objective + beta * kl.sum() / total_tokens
        kl_total += kl.sum().item()
    assert_grads_close(grads, model_grads(model, objective), f"KL {estimator} in loss")
    assert metrics["train/kl"] == pytest.approx(kl_total / total_tokens, rel=1e-4)


def test_kl_in_loss_adds_beta_times_kl(base_model):
    _, plain = grads_after_step(base_model, 4, "token", beta=0.0)
    _, with_kl = grads_after_step(base_model, 4, "token", beta=0.1)
    assert with_kl["train/kl"] > 0
    assert with_kl["train/loss"] == pytest.approx(plain["train/loss"] + 0.1 * with_kl["train/kl"], rel=1e-5)
    assert "train/kl" not in plain  # no reference model, no KL metric


def test_kl_in_reward_or_log_kl_leaves_the_loss_alone(base_model):
    """kl_in=reward (the trainer penalises the rewards) and log_kl with beta=0 both keep a
    reference model and log train/kl, but the loss gradient is the plain policy gradient."""
    plain, m_plain = grads_after_step(base_model, 4, "token")
    for hyper in ({"beta": 0.1, "kl_in": "reward"}, {"beta": 0.0, "log_kl": True}):
        grads, metrics = grads_after_step(base_model, 4, "token", **hyper)
        assert_grads_close(grads, plain, str(hyper))
        assert metrics["train/kl"] > 0 and metrics["train/loss"] == pytest.approx(m_plain["train/loss"])


def test_entropy_bonus_gradient(base_model):
    """loss = pg - coef * token_mean(entropy): compare to autograd of that, written out."""
    coef = 0.3
    grads, metrics = grads_after_step(base_model, 2, "token", entropy_coef=coef)
    _, plain = grads_after_step(base_model, 2, "token")
    assert metrics["train/entropy"] > 1.0  # a random model over a 49k vocabulary
    assert metrics["train/loss"] == pytest.approx(plain["train/loss"] - coef * metrics["train/entropy"],
                                                  rel=1e-5)
    model = copy.deepcopy(base_model)
    total_tokens = sum(len(c) for c in COMPLETIONS)
    objective = hand_written_objective(model, "token")
    for p, c in zip(PROMPTS, COMPLETIONS, strict=True):
        logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1: len(p) - 1 + len(c)]
        logq = torch.log_softmax(logits.float(), -1)
        objective = objective - coef * (-(logq.exp() * logq).sum(-1)).sum() / total_tokens
    assert_grads_close(grads, model_grads(model, objective), "entropy bonus")


def test_second_epoch_ratio_differs_from_one_and_clips(base_model, monkeypatch):
    """Old log-probs are taken once, before the first update: the first epoch sees ratio 1
    (up to round-off), the second sees the moved policy, and the clip acts."""
    ratios = []

    def recording(logp, old_logp, advantages, mask, ctx):
        out = ppo(logp, old_logp, advantages, mask, ctx)
        ratios.append(out[1]["ratio"][mask.bool()])
        return out

    patch_entry(monkeypatch, POLICY_LOSSES, "ppo", recording)
    steps, metrics, _ = run_train_step(base_model, 4, lr=5e-2, ppo_epochs=2)
    assert len(steps) == 2 and len(ratios) == 2  # one micro-batch per epoch
    assert (ratios[0] - 1).abs().max().item() < 1e-4
    assert (ratios[1] - 1).abs().max().item() > 0.2
    assert metrics["train/clip_frac"] > 0
    assert metrics["train/ratio_max"] > 1.2 or metrics["train/ratio_min"] < 0.8


def test_one_update_needs_no_old_logprob_pass(base_model, monkeypatch):
    calls = []
    monkeypatch.setattr(PolicyWorker, "row_logprobs", lambda self, *a: calls.append(a) or [])
    run_train_step(base_model, 2)
    assert calls == []


def test_mini_batches_split_the_rows_and_step_each(base_model):
    steps, metrics, worker = run_train_step(base_model, 8, mini_batches=2, ppo_epochs=3)
    assert len(steps) == 6 and metrics["train/updates"] == 6.0
    assert metrics["train/tokens"] == 11 and metrics["train/sequences"] == 4
    assert worker.learner.scheduler.last_epoch == 1  # the LR schedule counts training steps, not updates


def test_empty_loss_mask_skips_the_update(base_model):
    steps, metrics, worker = run_train_step(base_model, 2, lr=1e-2,
                                            loss_mask=torch.zeros(4, dtype=torch.bool))
    assert steps == [] and metrics["train/skipped_update"] == 1.0 and metrics["train/tokens"] == 0
    assert all(torch.equal(a, b) for a, b in zip(worker.model.parameters(), base_model.parameters(),
                                                  strict=True))


def test_reference_model_only_when_beta_positive(base_model):
    assert PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(beta=0.0)).ref_model is None
    worker = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(beta=0.05))
    assert worker.ref_model is not None
    assert not any(p.requires_grad for p in worker.ref_model.parameters())


def test_token_kl_is_zero_against_an_identical_reference(base_model):
    worker = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(beta=0.05, kl_estimator="k1"))
    kl = worker.token_kl(PROMPTS, COMPLETIONS, worker.reference_logprobs(PROMPTS, COMPLETIONS),
                         worker.logprobs(PROMPTS, COMPLETIONS))
    assert [len(k) for k in kl] == [len(c) for c in COMPLETIONS]
    assert max(k.abs().max().item() for k in kl) < 1e-6


@pytest.mark.parametrize("hyper", [{}, {"ppo_epochs": 2}], ids=["one update", "two updates"])
def test_the_reference_stage_log_probs_are_what_the_update_computes_and_it_reads_them(base_model, hyper):
    """KL in the loss with a row left out: the reference stage's log-probs of the trained rows
    (`rows`, in the update's micro-batches) give the update bitwise the gradient and metrics it
    gets computing them itself, and the update then never runs the reference model."""
    keep = torch.tensor([True, False, True, True])
    settings = dict(micro_batch_size=2, beta=0.1, lr=1e-3, **hyper)
    alone = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(**settings))
    staged = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(**settings))
    for worker in (alone, staged):  # the same reference, differing from the policy
        with torch.no_grad():
            for p, q in zip(worker.ref_model.parameters(), base_model.parameters(), strict=True):
                p.copy_(q + 0.01 * torch.sin(torch.arange(q.numel(), dtype=q.dtype)).view_as(q))
    ref = staged.reference_logprobs(PROMPTS, COMPLETIONS, keep)
    assert [len(r) for r in ref] == [3, 0, 5, 2]  # the row left out is not computed
    forwards = [0, 0]
    for k, worker in enumerate((alone, staged)):
        worker.ref_model.get_decoder().register_forward_hook(
            lambda *args, k=k: forwards.__setitem__(k, forwards[k] + 1))
    a = alone.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES, keep))
    b = staged.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES, keep, ref_logprobs=ref))
    assert forwards[0] > 0 and forwards[1] == 0
    assert a == b and a["train/kl"] > 0
    for p, q in zip(alone.model.parameters(), staged.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_token_level_advantages_equal_repeated_sequence_advantages(base_model):
    """A [N, T] advantage holding each row's value at every token is the [N] advantage."""
    flat = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(lr=1e-3))
    tokens = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(lr=1e-3))
    width = max(len(c) for c in COMPLETIONS)
    a = flat.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES))
    b = tokens.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES[:, None].expand(-1, width).clone()))
    assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-6)
    for p, q in zip(flat.model.parameters(), tokens.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_update_moves_weights_and_zero_advantage_does_not(base_model):
    worker = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(lr=1e-3))
    before = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
    m = worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, torch.zeros(4)))
    assert m["train/grad_norm"] == 0.0
    assert all(torch.equal(before[n], p) for n, p in worker.model.named_parameters())
    m = worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES))
    assert m["train/grad_norm"] > 0 and m["train/skipped_update"] == 0.0
    assert any(not torch.equal(before[n], p) for n, p in worker.model.named_parameters())
    # torch's fused AdamW kernel on plain CPU tensors; the gradients are freed after the step
    assert worker.learner.optimizer.defaults["fused"] is True
    assert all(p.grad is None for p in worker.model.parameters())


def test_fused_adam_equals_the_default_adam(base_model):
    """The fused kernel is an implementation of the same AdamW update (to float rounding)."""
    models = []
    for fused in (True, False):
        worker = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(lr=1e-3))
        if not fused:  # the same optimizer with torch's default (foreach) implementation
            group = worker.learner.optimizer.param_groups[0]
            worker.learner.optimizer = torch.optim.AdamW(
                group["params"], lr=group["lr"], betas=group["betas"], eps=group["eps"],
                weight_decay=group["weight_decay"])
        for _ in range(2):
            worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES))
        models.append(dict(worker.model.named_parameters()))
    moved = max((models[0][n] - p).abs().max().item() for n, p in base_model.named_parameters())
    assert moved > 1e-4  # the updates did change the weights
    for name, param in models[0].items():
        torch.testing.assert_close(param, models[1][name], rtol=1e-5, atol=1e-6, msg=name)


def test_gradients_and_adam_moments_live_in_single_buffers(base_model, monkeypatch):
    """reasonrl.accel.memory: the moments are views of one buffer each from the start (and
    again after loading a checkpoint's optimizer state); during an update the gradients are
    views of one buffer, dropped after the step."""
    worker = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(lr=1e-3))
    params = [p for p in worker.model.parameters() if p.requires_grad]

    def storages(key):
        return {worker.learner.optimizer.state[p][key].untyped_storage().data_ptr() for p in params}

    assert len(storages("exp_avg")) == 1 and len(storages("exp_avg_sq")) == 1
    seen = []
    clip = torch.nn.utils.clip_grad_norm_

    def spy(grad_params, *args, **kwargs):
        seen.append({p.grad.untyped_storage().data_ptr() for p in grad_params})
        return clip(grad_params, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES))
    assert len(seen) == 1 and len(seen[0]) == 1
    assert all(p.grad is None for p in params)
    moments = [worker.learner.optimizer.state[p]["exp_avg"].clone() for p in params]
    assert any(m.abs().max() > 0 for m in moments)

    other = PolicyWorker(copy.deepcopy(worker.model), 0, policy_settings(lr=1e-3))
    other.load_state_dict(copy.deepcopy(worker.state_dict()))  # as through a checkpoint file
    other_params = [p for p in other.model.parameters() if p.requires_grad]
    moved = other.learner.optimizer.state
    assert len({moved[p]["exp_avg"].untyped_storage().data_ptr() for p in other_params}) == 1
    for m, p in zip(moments, other_params, strict=True):
        assert torch.equal(other.learner.optimizer.state[p]["exp_avg"], m)
    worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES))
    other.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES))
    for a, b in zip(params, other_params, strict=True):
        assert torch.equal(a, b)


def test_higher_advantage_completion_becomes_more_likely(base_model):
    worker = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(lr=1e-2))
    mb = make_micro_batches(PROMPTS[:1], COMPLETIONS[:1], 1, 0)[0]
    with torch.no_grad():
        before = completion_logprobs(worker.model, mb)[0].sum().item()
    for _ in range(3):
        worker.train_step(TrainBatch(PROMPTS[:2], COMPLETIONS[:2], torch.tensor([1.0, -1.0])))
    with torch.no_grad():
        after = completion_logprobs(worker.model, mb)[0].sum().item()
    assert after > before + 0.1


def test_non_finite_loss_skips_the_update(base_model):
    worker = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(lr=1e-2))
    before = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
    m = worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, torch.tensor([float("nan"), 1.0, 1.0, 1.0])))
    assert m["train/skipped_update"] == 1.0
    assert all(torch.equal(before[n], p) for n, p in worker.model.named_parameters())


def test_loss_mask_drops_rows(base_model):
    worker = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(lr=0.0, max_grad_norm=0.0))
    m = worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES,
                                     loss_mask=torch.tensor([True, False, True, False])))
    assert m["train/tokens"] == 3 + 5


# ---- multi-turn episodes: the loss sees only the model's tokens -----------------------------

# 1 = a token the model sampled, 0 = an environment token between its turns (context only)
TOKEN_MASKS = [[1, 0, 1], [1], [1, 1, 0, 0, 1], [1, 1]]


@pytest.mark.parametrize("loss_agg", AGGREGATIONS)
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_multi_turn_gradient_is_the_masked_objective_for_every_micro_batch_size(base_model, loss_agg,
                                                                               ratio_level):
    """With token masks (multi-turn rows) the gradient is that of the objective over model
    tokens, the same for micro-batch sizes 1-4 and a token budget, with and without a shared prompt."""
    hyper = dict(loss_agg=loss_agg, ratio_level=ratio_level, max_response_length=8, token_mask=TOKEN_MASKS)
    (full,), m_full, _ = run_train_step(base_model, 4, share_prompt=False, **hyper)
    model = copy.deepcopy(base_model)
    expected = model_grads(model, hand_written_objective(model, loss_agg, ratio_level=ratio_level,
                                                         masks=TOKEN_MASKS))
    assert_grads_close(full, expected, "masked hand-written")
    assert m_full["train/tokens"] == 8.0  # model tokens only (13 completion tokens in all)
    for size, share, budget in [(1, False, 0), (3, False, 0), (1, True, 0), (2, True, 0), (4, True, 0),
                                (4, False, 12), (4, True, 12)]:
        (grads,), metrics, _ = run_train_step(base_model, size, share_prompt=share,
                                              max_tokens_per_micro_batch=budget, **hyper)
        assert_grads_close(grads, full, f"micro_batch_size={size}, share_prompt={share}, max_tokens={budget}")
        for key in ("train/loss", "train/entropy"):
            assert metrics[key] == pytest.approx(m_full[key], rel=1e-5, abs=1e-7), key


def test_multi_turn_invariance_with_kl_entropy_epochs_and_mini_batches(base_model):
    """KL in the loss, the entropy bonus, 2 epochs x 2 mini-batches: every optimizer step's
    gradient is the same for micro-batch sizes 1, 2 and 4, masks included; an all-ones mask is
    no mask at all (bitwise)."""
    assert_micro_batch_invariant(base_model, ppo_epochs=2, mini_batches=2, sgd_lr=0.5, token_mask=TOKEN_MASKS,
                                 **EXTRAS)
    ones = [[1] * len(c) for c in COMPLETIONS]
    (a,), ma, _ = run_train_step(base_model, 2, loss_agg="token")
    (b,), mb, _ = run_train_step(base_model, 2, loss_agg="token", token_mask=ones)
    assert all(torch.equal(a[k], b[k]) for k in a) and ma["train/loss"] == mb["train/loss"]


def test_a_token_mask_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="row 0: a token mask of 2 for 3 completion tokens"):
        make_micro_batches(PROMPTS, COMPLETIONS, 2, 0, token_masks=[[1, 1], [1], [1] * 5, [1, 1]])
