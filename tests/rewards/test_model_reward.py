"""Rewards from models (reward.model: the `judge` and `classifier` components): the verdict
probability and the number parse by hand, a hand-built classifier and judge scored through the
judge role's worker in its own process, batches equal to one row at a time, and a judge that
returns garbage, raises or hangs: counted, timed out, never a crash.

A judge's process costs seconds to start (torch and transformers imported, the model loaded):
tests that ask for the same reward.model share one for the module (`shared_judge`, `scripted`);
those that need a process of their own (a hand-built model, the one that hangs and is replaced)
build it (`judge_of`)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from pathlib import Path

import pytest
import torch

from reasonrl.batch import Example
from reasonrl.config import load_config
from reasonrl.config.reward import RewardModelConfig
from reasonrl.errors import ConfigError, ModelLoadError
from reasonrl.placement import Host, build_workers, roles
from reasonrl.rewards import model_reward, score, score_examples
from reasonrl.rewards.judging import (
    chat_of,
    classifier_scores,
    classifier_text,
    first_token_ids,
    judge_text,
    number_score,
    question_of,
    verdict_probability,
    verdict_scores,
)
from reasonrl.workers.frozen import FrozenModel
from reasonrl.workers.judge import RewardModelWorker, judge_model

SCRIPTED = str(Path(__file__).parents[1] / "fixtures" / "scripted_judge.py") + ":judge"
PROMPTS = ["What is 2 + 3?",
           [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 4 + 4?"}],
           "What is 10 - 7?", "What is 6 + 6?", "What is 1 + 1?", "What is 9 - 9?"]
COMPLETIONS = ["The answer is 5.", "8", "It is 3, since ten minus seven is three.", "The answer is 13.", "2",
               "zero"]
TRUTHS = ["5", "8", "3", "12", "2", "0"]


def spec(**values) -> RewardModelConfig:
    return dataclasses.replace(RewardModelConfig(), **values)


def judge_workers(model_cfg: RewardModelConfig, kind: str = "judge"):
    """The judge role for that reward.model, built as a run builds it (`build_workers`: its own
    process)."""
    cfg = load_config("configs/smoke.yaml", [f"reward.weights={{correct: 1.0, {kind}: 1.0}}"])
    cfg = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, model=model_cfg))
    return build_workers(cfg, roles=("judge",))


@pytest.fixture
def judge_of():
    """judge_of(reward.model, kind): a judge role's worker of its own (`judge_workers`); every one
    built is closed after the test."""
    built = []

    def make(model_cfg: RewardModelConfig, kind: str = "judge"):
        built.append(judge_workers(model_cfg, kind))
        return built[-1].judge

    yield make
    for workers in built:
        workers.close()


@pytest.fixture(scope="module")
def shared_judge():
    """shared_judge(reward.model, kind): the judge role's worker for that reward.model, one per
    (reward.model, kind) for the module's tests (in one xdist worker), closed after them."""
    built: dict[tuple[str, str], object] = {}

    def make(model_cfg: RewardModelConfig, kind: str = "judge"):
        key = (kind, repr(model_cfg))
        if key not in built:
            built[key] = judge_workers(model_cfg, kind)
        return built[key].judge

    yield make
    for workers in built.values():
        workers.close()


# ---- the formulas, by hand ----------------------------------------------------------------------

def test_verdict_probability_by_hand():
    """s = P(yes) / (P(yes) + P(no)), P summed over each verdict's tokens. Row 0: P(yes) : P(no)
    = e^0 : e^(ln 3) = 1 : 3 -> 0.25 (other tokens' mass does not matter). Row 1: yes over
    tokens 0 and 2: (2 + 2) : 1 -> 0.8. Row 2: neither verdict has probability -> NaN."""
    inf = float("inf")
    logits = torch.tensor([[0.0, math.log(3), 5.0, 7.0],
                           [math.log(2), 0.0, math.log(2), 9.0],
                           [-inf, -inf, -inf, 0.0]])
    assert verdict_probability(logits[:1], [0], [1]).tolist() == pytest.approx([0.25])
    assert verdict_probability(logits[1:2], [0, 2], [1]).tolist() == pytest.approx([0.8])
    assert math.isnan(verdict_probability(logits[2:], [0], [1]).item())
    assert verdict_probability(logits.to(torch.bfloat16)[:1], [0], [1]).dtype == torch.float32  # read in fp32


def test_number_score_reads_the_first_number_within_range():
    assert number_score("Score: 7 out of 10", 10) == 0.7
    assert number_score("7.5", 10) == 0.75
    assert number_score("0", 10) == 0.0
    for text, why in (("I cannot say", "no number"), ("12", "outside 0..10"), ("-1", "outside 0..10")):
        assert why in number_score(text, 10)


def test_the_texts_a_classifier_and_a_judge_read(tokenizer):
    assert chat_of("Q?") == [{"role": "user", "content": "Q?"}]
    assert question_of(PROMPTS[1]) == "What is 4 + 4?"  # the last user message, not the system prompt
    chat = [*PROMPTS[1], {"role": "assistant", "content": "8"}]
    assert classifier_text(tokenizer, PROMPTS[1], "8") == tokenizer.apply_chat_template(chat, tokenize=False)
    text = judge_text(tokenizer, "Q: {question} A: {completion} T: {ground_truth}", PROMPTS[0], "5.", "5")
    message = [{"role": "user", "content": "Q: What is 2 + 3? A: 5. T: 5"}]
    assert text == tokenizer.apply_chat_template(message, tokenize=False, add_generation_prompt=True)
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    assert classifier_text(plain, "Q?", "A.") == "Q?\n\nA."
    assert judge_text(plain, "{question}|{completion}", "Q?", "A.", "1") == "Q?|A.\n"
    assert first_token_ids(tokenizer, "Yes") == [tokenizer.encode("Yes")[0], tokenizer.encode(" Yes")[0]]


# ---- hand-built models through the real worker --------------------------------------------------

def _zeroed(model):
    """Every decoder layer adds nothing to the residual stream (attention and MLP outputs 0):
    the last position's hidden state is the final RMSNorm of its own token's embedding."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
    return model


def _config(tokenizer, **extra):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=512,
                       pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **extra)


def rms(x: list[float], eps: float) -> float:
    return math.sqrt(sum(v * v for v in x) / len(x) + eps)


def test_a_hand_built_classifier_scores_as_computed_by_hand(tokenizer, tmp_path, judge_of):
    """A one-label classifier whose score is w . RMSNorm(E[last token]): rows ending in token a
    (E = 3 e0) score 3 / rms, token b (E = -2 e0 + e1) (-2 + 0.5) / rms, any other token 0; the
    worker reads prompt + completion (no chat template: joined by a blank line), one batch of 3."""
    from transformers import LlamaForSequenceClassification

    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    config = _config(plain, num_labels=1)
    model = _zeroed(LlamaForSequenceClassification(config))
    completions = ["so it is yes", "so it is no", "hmm"]
    last = [plain.encode(classifier_text(plain, PROMPTS[0], c))[-1] for c in completions]
    assert len(set(last)) == 3
    a, b = [0.0] * 32, [0.0] * 32
    a[0], b[0], b[1] = 3.0, -2.0, 1.0
    with torch.no_grad():
        model.model.embed_tokens.weight[last[0]] = torch.tensor(a)
        model.model.embed_tokens.weight[last[1]] = torch.tensor(b)
        model.score.weight.zero_()
        model.score.weight[0, 0], model.score.weight[0, 1] = 1.0, 0.5
    model.save_pretrained(tmp_path / "rm")
    plain.save_pretrained(tmp_path / "rm")
    eps = config.rms_norm_eps
    expected = [3.0 / rms(a, eps), (-2.0 + 0.5) / rms(b, eps), 0.0]
    rm = spec(path=str(tmp_path / "rm"), batch_size=3)
    scores, failures, timed_out = model_reward.score_with_model(
        "classifier", rm, judge_of(rm, "classifier"), [PROMPTS[0]] * 3, completions, ["5"] * 3, [0, 1, 2])
    assert scores == pytest.approx(expected, rel=1e-5) and failures == [None] * 3 and timed_out == [False] * 3


def test_a_hand_built_judge_gives_its_verdict_probability(tokenizer, tmp_path, judge_of):
    """A causal LM whose next-token logits after any judge text are l(Yes) = 2 s, l(No) = -1 s,
    every other token 0, with s = 1 / rms(e0): P = (e^(2s) + e^0) / (e^(2s) + 1 + e^(-s) + 1),
    " Yes" and " No" (logit 0) counted with their verdicts; combined with `correct` by weights."""
    from transformers import LlamaForCausalLM

    config = _config(tokenizer, tie_word_embeddings=False)
    model = _zeroed(LlamaForCausalLM(config))
    newline = tokenizer.encode(judge_text(tokenizer, RewardModelConfig().template, PROMPTS[0], "5", "5"))[-1]
    with torch.no_grad():
        model.model.embed_tokens.weight[newline, 0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[tokenizer.encode("Yes")[0], 0] = 2.0
        model.lm_head.weight[tokenizer.encode("No")[0], 0] = -1.0
    model.save_pretrained(tmp_path / "judge")
    tokenizer.save_pretrained(tmp_path / "judge")
    s = 1.0 / rms([1.0] + [0.0] * 31, config.rms_norm_eps)
    p = (math.exp(2 * s) + 1) / (math.exp(2 * s) + 1 + math.exp(-s) + 1)
    judge = spec(path=str(tmp_path / "judge"))
    result = score(COMPLETIONS[:3], TRUTHS[:3], {"correct": 1.0, "judge": 0.5}, prompts=PROMPTS[:3],
                   model=judge, judge=judge_of(judge))
    assert result.components["judge"].tolist() == pytest.approx([p] * 3, rel=1e-5)
    assert result.total.tolist() == pytest.approx([1 + 0.5 * p] * 3, rel=1e-5)
    assert result.errors == 0 and list(result.components) == ["correct", "judge"]


def test_batches_score_as_one_row_at_a_time(tiny, tmp_path, shared_judge):
    """Left-padded judge batches and right-padded classifier batches of rows of different lengths
    give each row's score alone, in this process and through the worker (float rounding of
    matrix products of other shapes: 1e-5)."""
    model, tokenizer = tiny
    texts = [judge_text(tokenizer, RewardModelConfig().template, p, c, t)
             for p, c, t in zip(PROMPTS, COMPLETIONS, TRUTHS, strict=True)]
    assert len({len(tokenizer.encode(t)) for t in texts}) > 3
    alone = {"judge": [verdict_scores(model, tokenizer, [t], "Yes", "No", 1)[0] for t in texts]}
    batched = verdict_scores(model, tokenizer, texts, "Yes", "No", batch_size=6)
    assert batched == pytest.approx(alone["judge"], abs=1e-5)
    assert len({round(v, 6) for v in batched}) == 6  # six rows, six scores: the padding is not what is read
    # the tiny classifier as the worker builds it (reward.model.path=tiny)
    tiny_spec = {"kind": "classifier", **dataclasses.asdict(spec(path="tiny")), "device": "cpu"}
    rm, _ = judge_model(tiny_spec)
    texts = [classifier_text(tokenizer, p, c) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    alone["classifier"] = [classifier_scores(rm, tokenizer, [t], 1)[0] for t in texts]
    batched = classifier_scores(rm, tokenizer, texts, batch_size=6)
    assert batched == pytest.approx(alone["classifier"], abs=1e-5)
    assert len({round(v, 6) for v in batched}) == 6
    for kind in ("judge", "classifier"):  # the worker's batches of 6 against the rows scored alone here
        six_cfg = spec(path="tiny", batch_size=6)
        six = model_reward.score_with_model(kind, six_cfg, shared_judge(six_cfg, kind), PROMPTS,
                                            COMPLETIONS, TRUTHS, list(range(6)))[0]
        assert six == pytest.approx(alone[kind], abs=1e-5) and len(set(six)) == 6, kind


def test_the_judge_is_a_frozen_model_holding_what_it_loaded(tiny, shared_judge):
    """The judge role's worker is a `FrozenModel`: `from_config` loads reward.model once (the
    tiny judge is `model.load`'s tiny model, weight for weight) and the worker holds it, frozen
    (no gradient, eval mode; two workers, two models: no cache between them). A causal judge's
    `logprobs` are its token log-probs (by hand: log_softmax of the logits of one forward over
    prompt + completion, at the completion's targets), in its process as in this one; a
    classifier scores and has no token log-probs."""
    model, _ = tiny
    cfg = load_config("configs/smoke.yaml", ["reward.weights={correct: 1.0, judge: 1.0}",
                                             "reward.model.path=tiny"])
    worker = RewardModelWorker.from_config(cfg, Host(device="cpu"))
    again = RewardModelWorker.from_config(cfg, Host(device="cpu"))
    assert isinstance(worker, FrozenModel) and worker.model is not again.model
    assert not worker.model.training and not any(p.requires_grad for p in worker.model.parameters())
    tiny_weights = dict(model.named_parameters())
    assert all(torch.equal(p, tiny_weights[name]) for name, p in worker.model.named_parameters())
    prompts, completions = [[1, 5, 9], [1, 7]], [[20, 21], [30, 31, 32]]
    found = worker.logprobs(prompts, completions)
    for p_ids, c_ids, logp in zip(prompts, completions, found, strict=True):
        ids = torch.tensor([p_ids + c_ids])
        with torch.no_grad():
            logits = worker.model(ids).logits[0, len(p_ids) - 1: -1].float()
        by_hand = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c_ids).unsqueeze(-1)).squeeze(-1)
        assert logp.shape == (len(c_ids),) and torch.allclose(logp, by_hand, atol=1e-5)
    remote = shared_judge(spec(path="tiny", batch_size=6)).logprobs(prompts, completions)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(remote, found, strict=True))
    classifier_cfg = load_config("configs/smoke.yaml", ["reward.weights={correct: 1.0, classifier: 1.0}",
                                                        "reward.model.path=tiny"])
    rm = RewardModelWorker.from_config(classifier_cfg, Host(device="cpu"))
    assert rm.model.__class__.__name__ == "LlamaForSequenceClassification" and not rm.model.training
    scores = rm.score(PROMPTS[:2], COMPLETIONS[:2], TRUTHS[:2])
    assert len(scores) == 2 and all(isinstance(v, float) for v in scores) and scores[0] != scores[1]
    with pytest.raises(ValueError, match="has no token log-probs"):
        rm.logprobs(prompts, completions)


# ---- failures: garbage, raise, hang --------------------------------------------------------------

def test_a_judge_whose_answers_are_garbage_is_counted_not_fatal(judge_of):
    """The tiny random judge asked for a number answers none: every row scores 0, each counted in
    `errors` with the judge's text; `correct` is unaffected."""
    number = spec(path="tiny", parse="number", max_new_tokens=4)
    result = score(COMPLETIONS[:4], TRUTHS[:4], {"correct": 1.0, "judge": 1.0}, prompts=PROMPTS[:4],
                   model=number, judge=judge_of(number))
    assert result.components["judge"].tolist() == [0.0] * 4
    assert result.total.tolist() == [1.0, 1.0, 1.0, 0.0] and result.errors == 4 and result.timeouts == 0
    assert all(f.startswith("the judge (reward.model.path=tiny): ValueError: no number in the judge's answer")
               for f in result.failures)


def scripted_row(monkeypatch, log: Path) -> None:
    """The judge role's worker scores with tests/fixtures/scripted_judge.py:judge (its table row's
    build given that target), logging each call's completions to `log`."""
    log.touch()
    monkeypatch.setenv("SCRIPTED_JUDGE_LOG", str(log))
    row = dataclasses.replace(roles.role("judge"), build=functools.partial(RewardModelWorker.from_config,
                                                                          target=SCRIPTED))
    monkeypatch.setattr(roles, "ROLES", tuple(row if r.name == "judge" else r for r in roles.ROLES))


def calls_in(log: Path) -> list[list[str]]:
    return [line.split("|") for line in log.read_text().splitlines()]


@pytest.fixture
def scripted(monkeypatch, tmp_path):
    """Judges built in the test (`judge_of`) score with the scripted judge; returns the log of the
    completions of each call they got."""
    scripted_row(monkeypatch, tmp_path / "calls.log")
    return lambda: calls_in(tmp_path / "calls.log")


@pytest.fixture(scope="module")
def shared_scripted(tmp_path_factory):
    """The scripted judge's worker shared by the module's tests ((its worker, its call log); the
    log emptied for each test by `scripted_judge`). Its reward.model's batch_size is not its
    callers': `score` cuts the batches by the reward.model it is given."""
    log = tmp_path_factory.mktemp("scripted") / "calls.log"
    with pytest.MonkeyPatch.context() as patch:  # in force while its process starts
        scripted_row(patch, log)
        workers = judge_workers(spec(path="tiny"))
    yield workers.judge, log
    workers.close()


@pytest.fixture
def scripted_judge(shared_scripted):
    """(the shared scripted judge, the log of this test's calls)."""
    judge, log = shared_scripted
    log.write_text("")
    return judge, lambda: calls_in(log)


def test_a_judge_that_raises_or_returns_garbage_fails_those_rows_only(scripted_judge):
    completions = ["5", "RAISE 8", "x", "GARBAGE 12", "2", "0"]
    cfg = spec(path="tiny", batch_size=2)
    judge, calls = scripted_judge
    result = score(completions, TRUTHS, {"correct": 1.0, "judge": 1.0}, prompts=PROMPTS, model=cfg,
                   judge=judge)
    # batches [0, 1] (raises: both rows fail), [2, 3] (row 3 unreadable), [4, 5]
    assert result.components["judge"].tolist() == [0.0, 0.0, 0.25, 0.0, 0.75, 0.75]
    assert result.components["correct"].tolist() == [1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert result.errors == 3 and result.timeouts == 0
    raised = "the judge (reward.model.path=tiny): RuntimeError: the judge exploded"
    assert result.failures[0] == result.failures[1] == raised
    assert result.failures[3] == ("the judge (reward.model.path=tiny): ValueError: no number in the "
                                  "judge's answer 'I cannot say'")
    assert [result.failures[i] for i in (2, 4, 5)] == [None] * 3
    assert len(calls()) == 3


def test_a_judge_that_hangs_is_killed_counted_and_replaced(scripted, judge_of):
    """The hung batch (SIGALRM blocked: only the kill at 1.2 x 1 + 0.5 s ends it) times out on
    its rows; the next batch goes to a fresh worker process and scores."""
    cfg = spec(path="tiny", batch_size=1, timeout=1.0)
    judge = judge_of(cfg)
    result = score(["5", "HANG", "2"], ["5", "8", "2"], {"judge": 1.0}, prompts=PROMPTS[:3], model=cfg,
                   judge=judge)
    assert result.components["judge"].tolist() == [0.75, 0.0, 0.75]
    assert result.timeouts == 1 and result.errors == 0 and result.timed_out == [False, True, False]
    assert result.failures[1] == ("the judge (reward.model.path=tiny): timed out (reward.model.timeout: "
                                  "1 s per batch of 1)")
    assert judge.killed == 1 and [c[0] for c in scripted()] == ["5", "HANG", "2"]


def test_rows_the_gate_zeroes_are_not_sent_to_the_model(scripted_judge):
    completions = ["<think>a</think><answer>5</answer>", "5", "<think>b</think><answer>7</answer>"]
    cfg = spec(path="tiny")
    judge, calls = scripted_judge
    result = score(completions, ["5", "5", "7"], {"format": 0.0, "judge": 1.0}, gate=["format"],
                   prompts=PROMPTS[:3], model=cfg, judge=judge)
    assert result.components["judge"].tolist() == [0.75, 0.0, 0.75] and result.errors == 0
    assert calls() == [[completions[0], completions[2]]]


# ---- start-up: loading and the config ------------------------------------------------------------

def test_the_preflight_refuses_a_judge_folder_that_does_not_exist(tmp_path, monkeypatch):
    """An asynchronous local run builds its judge in the rollout process at the first step: the
    preflight checks reward.model.path first, in one line, before any model loads (and a
    folder without config.json too); tiny, the default and Hub ids pass to the loader."""
    from reasonrl.model import load as load_module
    from reasonrl.placement import preflight

    def no_load(*args, **kwargs):
        raise AssertionError("the preflight loaded a model")

    monkeypatch.setattr(load_module, "load_model_and_tokenizer", no_load)
    overrides = ["reward.weights={correct: 1.0, judge: 0.5}", "trainer.max_staleness=1", "model.path=tiny"]
    cfg = load_config("configs/smoke.yaml", [*overrides, f"reward.model.path={tmp_path}/none"])
    with pytest.raises(ModelLoadError, match=rf"^reward.model.path={tmp_path}/none: no such folder"):
        preflight(cfg)
    (tmp_path / "empty").mkdir()
    cfg = load_config("configs/smoke.yaml", [*overrides, f"reward.model.path={tmp_path}/empty"])
    with pytest.raises(ModelLoadError, match=r"^reward.model.path=.*has no config.json"):
        preflight(cfg)
    for path in ("tiny", "HuggingFaceTB/not-a-local-folder"):
        preflight(load_config("configs/smoke.yaml", [*overrides, f"reward.model.path={path}"]))


def test_a_model_that_cannot_load_stops_the_run_at_start_up(tiny, tmp_path, shared_judge):
    """The judge role's model loads when the role is built (with the run's workers): one that
    cannot stops the run there; one that can scores (the tiny judge as the batches test has it)."""
    examples = [Example("What is 2 + 3?", "5", "arithmetic")]
    cfg = load_config("configs/smoke.yaml", ["reward.weights={correct: 1.0, judge: 0.5}",
                                             f"reward.model.path={tmp_path}/none"])
    with pytest.raises(ModelLoadError, match=rf"^reward.model.path={tmp_path}/none: no such folder"):
        build_workers(cfg, roles=("judge",))
    model, tokenizer = tiny
    copy.deepcopy(model).save_pretrained(tmp_path / "lm")  # a causal LM, no classification head
    tokenizer.save_pretrained(tmp_path / "lm")
    cfg = load_config("configs/smoke.yaml", ["reward.weights={correct: 1.0, classifier: 0.5}",
                                             f"reward.model.path={tmp_path}/lm"])
    with pytest.raises(ModelLoadError, match="no trained classification head"):
        build_workers(cfg, roles=("judge",))
    ok = load_config("configs/smoke.yaml", ["reward.weights={correct: 1.0, judge: 0.5}",
                                            "reward.model.path=tiny"])
    judge = shared_judge(spec(path="tiny", batch_size=6))  # the tiny judge loaded in its process
    scored = score_examples(["5"], examples, ok.reward, judge=judge)
    assert scored.components["judge"].numel() == 1 and scored.errors == 0


@pytest.mark.parametrize("overrides, message", [
    (["reward.weights={correct: 1.0, judge: 1.0, classifier: 1.0}"], "judge and classifier are both scored"),
    (["reward.weights={correct: 1.0, judge: 1.0}", "reward.model.template='{question} {answer}'"],
     "reward.model.template: unknown field(s) ['answer']"),
    (["reward.weights={correct: 1.0, judge: 1.0}", "reward.model.template='{question'"],
     "reward.model.template: "),
    (["reward.weights={correct: 1.0, judge: 1.0}", "reward.model.verdicts=[Sure, Sure]"],
     "reward.model.verdicts: two different words"),
    (["reward.weights={correct: 1.0, judge: 1.0}", "reward.model.verdicts=[Yes, No]"],
     "reward.model.verdicts[0]: expected a string, got True"),  # YAML reads unquoted Yes / No as booleans
    (["reward.model.path=tiny"], "reward.model.path: set, but reward.weights names neither"),
    # reward.model's own placement is gone: the judge is a role (placement.judge, placement.mode)
    (["reward.weights={correct: 1.0, judge: 1.0}", "reward.model.placement=ray"],
     "reward.model.placement was removed: set placement.mode"),
    (["reward.weights={correct: 1.0, judge: 1.0}", "reward.model.num_gpus=1"],
     "reward.model.num_gpus was removed: set placement.judge.num_gpus"),
    (["reward.weights={correct: 1.0, judge: 1.0}", "reward.model.device=cpu"],
     "reward.model.device was removed: set placement.device"),
    (["placement.judge.num_cpus=2"], "placement.judge.num_cpus: set, but reward.weights names neither"),
])
def test_bad_reward_model_settings_fail_at_load(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config("configs/smoke.yaml", overrides)
    assert message in str(err.value)


def test_reasonrl_reward_shows_the_judge_with_the_prompt_given(tmp_path, capsys):
    """`reasonrl reward --config C --prompt Q --ground-truth T completion`: the judge reads the
    question; its component beside `correct`, the total their weighted sum."""
    import json

    from reasonrl.cli import main

    config = tmp_path / "judge.yaml"
    config.write_text("reward:\n  weights: {correct: 1.0, judge: 0.5}\n  model:\n    path: tiny\n")
    assert main(["reward", "--config", str(config), "--prompt", "What is 3 + 4?", "--ground-truth", "7",
                 "The answer is 7."]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["components"]["correct"] == 1.0 and 0.0 < row["components"]["judge"] < 1.0
    assert row["score"] == pytest.approx(1.0 + 0.5 * row["components"]["judge"]) and row["error"] is None
