"""Scoring: completions in, one `Scores` record out (the weighted total, each component, and
every reward call that failed, row by row).

A reward component is a function (completion, ground_truth) -> float (`REWARD_COMPONENTS`).
The `correct` component is each row's task verifier (`verifiers.verifier_for`), and every
verifier is called in one shape, the batch form TRL calls its `reward_funcs` in:

    fn(completions, ground_truths, groups, extra_infos, **options) -> one score per row

`reward.batch_fn` is written in that form. A per-sample function (a task verifier, or
`reward.fn`: fn(completion, ground_truth, extra_info, **options)) is the convenience form,
turned into the batch form by `per_sample` (in-process), or sent to the worker pool one row
per call, each with its own hard timeout (isolated). A reward function of the config
(reward.fn, reward.batch_fn, each reward.fns entry, the last each a component of its own name)
has a style (`styles.py`: reasonrl's own forms, TRL's, verl's, OpenRLHF's) and is called as
that style calls it (`styles.invoke`), per completion or once per batch, in the same places.
Whatever the form, a call gives one pool `Outcome` per row, and `score` reads them all the same
way. A row whose reward raises, hangs or returns a bad value scores 0 and is counted (one odd
completion must not end a run); a verifier that cannot read a ground truth
(`GroundTruthError`) stops it: a data bug. A TRL function's None leaves its component out of
that row's total (`Scores.applied`; TRL's nansum).

A bad value is anything but a number (or a dict with a 'score'), a number that is not finite
(NaN, inf), or one beyond +-`MAX_ABS_REWARD` (`bounded_score`): training computes in float32,
where a reward of 1e308 is already inf and its batch mean (`reward/mean`) NaN; the weighted
total of the components is held to the same bound.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from reasonrl.batch import Scores
from reasonrl.errors import GroundTruthError
from reasonrl.registry import REWARD_COMPONENTS
from reasonrl.rewards.failures import describe_exception, describe_verifier
from reasonrl.rewards.model_reward import is_model_component, score_with_model
from reasonrl.rewards.pool import Call, Outcome, get_pool
from reasonrl.rewards.styles import COLUMNS, invoke
from reasonrl.rewards.verifiers import Verifier, as_score, function_verifiers, task_verifier, verifier_for

RewardFn = Callable[[str, str], float]  # (completion, ground_truth) -> score

# The largest |reward| scored: training's arithmetic is float32 (largest finite 3.4e38) and
# squares rewards (the group std) and gradients that scale with them (the gradient norm, Adam's
# second moment), so a reward must stay far below sqrt(3.4e38) ~ 1.8e19 for a batch's sums of
# squares to stay finite; 1e9 leaves that room, and above 2^24 float32 no longer holds every
# integer anyway. A larger reward is in practice a sentinel or a bug (1e308, sys.float_info.max).
MAX_ABS_REWARD = 1e9


def bounded_score(value: object) -> tuple[float, dict[str, float]]:
    """(score, parts) of a reward function's return value (`as_score`), its score finite and
    within +-`MAX_ABS_REWARD`; ValueError or TypeError otherwise, saying which."""
    try:
        score, parts = as_score(value)
    except OverflowError as err:  # float(10**400)
        raise ValueError(f"reward is too large for a float ({err})") from None
    if abs(score) > MAX_ABS_REWARD:
        raise ValueError(f"reward {score:g} is beyond +-{MAX_ABS_REWARD:g}, the most float32 training takes "
                         f"safely (it squares rewards and gradients); scale the reward down")
    return score, parts


class BadGroundTruth(GroundTruthError):
    """A verifier could not read the ground truth of row `row` (None: a batch reward raised it
    for its whole batch; `function` names it), so the caller can name the record."""

    def __init__(self, message: str, row: int | None, function: str = ""):
        super().__init__(message)
        self.row, self.function = row, function


def make_reward_fn(name: str, fallback_last_number: bool = True) -> RewardFn:
    """The (completion, ground_truth) -> float function of a `REWARD_COMPONENTS` name.

    `fallback_last_number` only matters for "correct": off, an answer must be boxed or tagged.
    """
    return partial(REWARD_COMPONENTS.get(name), fallback_last_number=fallback_last_number)


def per_sample(fn: Callable[..., object]) -> Callable[..., list[Outcome]]:
    """The batch form of a per-sample reward fn(completion, ground_truth, extra_info, **options):
    called row by row, one `Outcome` per row, so a row that raises fails alone."""
    def batch_fn(completions, ground_truths, groups, extra_infos, **options) -> list[Outcome]:
        return [_call_here(partial(fn, c, g, e, **options))
                for c, g, e in zip(completions, ground_truths, extra_infos, strict=True)]
    return batch_fn


def _call_here(call: Callable[[], object]) -> Outcome:
    """An in-process call as the pool reports one. SystemExit is a failure like any other."""
    try:
        return Outcome(value=call())
    except GroundTruthError as err:
        return Outcome(error=str(err), ground_truth_error=True)
    except (Exception, SystemExit) as err:
        return Outcome(error=describe_exception(err))


def _split(out: Outcome, n: int) -> list[Outcome]:
    """A batch call's one Outcome as one per row: its n scores, or its failure on every row (a
    call that raised, ran out of time, or returned anything but n readable scores)."""
    if out.error is None and not out.timed_out:
        try:
            if not isinstance(out.value, (list, tuple)) or len(out.value) != n:
                size = len(out.value) if isinstance(out.value, (list, tuple)) else "-"
                raise ValueError(f"reward.batch_fn must return one score per completion ({n}), "
                                 f"got {type(out.value).__name__} of length {size}")
            for value in out.value:
                bounded_score(value)
            return [Outcome(value=value) for value in out.value]
        except (TypeError, ValueError) as err:
            out = Outcome(error=f"{type(err).__name__}: {err}")
    return [out] * n


def _styled(out: Outcome, n: int, verifier: Verifier) -> list[Outcome]:
    """A styled call's Outcome (`styles.invoke`'s {"values", "logged"}) as one per row, or its
    failure on every row. A TRL function's None is "does not apply" (`not_applied`), any other
    style's a bad value; reasonrl's batch form keeps its contract: one unreadable score fails its
    whole batch (`_split`)."""
    if out.error is not None or out.timed_out:
        return [out] * n
    values, logged = out.value["values"], out.value["logged"]
    if verifier.style == "reasonrl_batch":
        try:
            for value in values:
                bounded_score(value)
        except (TypeError, ValueError) as err:
            return [Outcome(error=f"{type(err).__name__}: {err}")] * n
    trl = verifier.style == "trl"
    return [Outcome(value=value, logged=row or None, not_applied=trl and value is None)
            for value, row in zip(values, logged, strict=True)]


def _call_styled(verifier: Verifier, columns: dict[str, list]) -> list[Outcome]:
    """A reward function of the config over these rows (`columns`: `styles.COLUMNS`), called as
    its style calls it: a batch style once (in the pool: `reward.timeout` seconds per row), a
    per-completion style row by row (in the pool: one call and timeout per row)."""
    n, kwargs = len(columns["completions"]), verifier.call_kwargs()
    batches = [columns] if verifier.batch else [{k: v[i: i + 1] for k, v in columns.items()}
                                                for i in range(n)]
    if verifier.isolated:
        calls = [Call(verifier.target, "", "", options=kwargs, batch=b, style=verifier.style)
                 for b in batches]
        timeout = verifier.timeout * (n if verifier.batch else 1)
        found = get_pool(verifier.workers, verifier.max_memory_mb).run(calls, timeout)
    else:
        loaded = _call_here(verifier.fn)  # a function that does not load fails every row
        if loaded.error is not None:
            return [loaded] * n
        found = [_call_here(partial(invoke, verifier.style, loaded.value, b, kwargs)) for b in batches]
    return [row for out, b in zip(found, batches, strict=True)
            for row in _styled(out, len(b["completions"]), verifier)]


def call_reward(verifier: Verifier, completions: list[str], ground_truths: list[str], groups: list[int],
                extra_infos: list[dict], prompts: list | None = None, completion_ids: list | None = None,
                data_sources: list[str] | None = None) -> list[Outcome]:
    """One call of `verifier` over these rows, one `Outcome` per row, whatever its form: a batch
    function once (in the pool: one call with `reward.timeout` seconds per row); a per-sample
    one row by row (`per_sample`), or one pool call per row when isolated; a reward function of
    the config as its style calls it (`_call_styled`), with the rows' prompts, completion ids
    (None: not known) and data sources besides."""
    n, options = len(completions), dict(verifier.options)
    if verifier.style:
        return _call_styled(verifier, dict(zip(COLUMNS, (
            completions, ground_truths, groups, extra_infos, prompts or [""] * n,
            completion_ids or [None] * n, data_sources or ["unknown"] * n), strict=True)))
    columns = (completions, ground_truths, groups, extra_infos)
    if verifier.isolated and verifier.batch:
        batch = dict(zip(("completions", "ground_truths", "groups", "extra_infos"), columns, strict=True))
        call = Call(verifier.target, "", "", options=options, batch=batch)
        pool = get_pool(verifier.workers, verifier.max_memory_mb)
        return _split(pool.run([call], verifier.timeout * n)[0], n)
    if verifier.isolated:
        calls = [Call(verifier.target, c, g, e, options)
                 for c, g, e in zip(completions, ground_truths, extra_infos, strict=True)]
        return get_pool(verifier.workers, verifier.max_memory_mb).run(calls, verifier.timeout)
    loaded = _call_here(verifier.fn)  # a function that does not load fails every row
    if loaded.error is not None:
        return [loaded] * n
    if verifier.batch:
        return _split(_call_here(partial(loaded.value, *columns, **options)), n)
    return per_sample(loaded.value)(*columns, **options)


def _verify(verifiers: list[Verifier], columns: dict[str, list]) -> list[Outcome]:
    """A function component (`correct`, a reward.fns entry) for every row: one `call_reward`
    per verifier over its rows (`columns`: `styles.COLUMNS`), the in-process ones first, then
    those in the worker pool (they wait for nothing unread). The first bad ground truth of a
    stage is raised as `BadGroundTruth` with its row."""
    by_verifier: dict[Verifier, list[int]] = {}
    for i, v in enumerate(verifiers):
        by_verifier.setdefault(v, []).append(i)
    outcomes: list[Outcome] = [Outcome()] * len(verifiers)
    for pooled in (False, True):
        for v, rows in by_verifier.items():
            if (v.isolated and not v.batch) != pooled:
                continue
            found = call_reward(v, *([columns[k][i] for i in rows] for k in COLUMNS))
            for i, out in zip(rows, found, strict=True):
                outcomes[i] = out
        bad = [i for i, out in enumerate(outcomes) if out.ground_truth_error]
        if bad:
            v = verifiers[bad[0]]
            raise BadGroundTruth(outcomes[bad[0]].error, None if v.batch else bad[0], describe_verifier(v))
    return outcomes


def _read(out: Outcome, verifier: Verifier, rows: int) -> tuple[float, dict[str, float], str | None]:
    """(score, parts, why it failed or None) of one row's Outcome; `rows`: the rows scored. A
    function that does not apply (TRL's None) scores 0 here; its caller leaves it out."""
    if out.not_applied:
        return 0.0, {}, None
    if out.timed_out:
        limit = verifier.timeout * (rows if verifier.batch else 1)  # a batch call: reward.timeout per row
        return 0.0, {}, f"timed out (reward.timeout: {limit:g} s)"
    if out.out_of_memory:  # a worker's MemoryError: its bound (or the machine) ran out
        bound = f"{verifier.max_memory_mb} MB" if verifier.max_memory_mb else "no bound"
        return 0.0, {}, f"out of memory (reward.max_memory_mb: {bound}): {out.error}"
    if out.error is not None:
        return 0.0, {}, out.error
    try:
        return *bounded_score(out.value), None
    except Exception as err:
        return 0.0, {}, f"{type(err).__name__}: {err}"


def score(completions: list[str], ground_truths: list[str], weights: dict[str, float],
          fallback_last_number: bool = True, *, verifiers: list[Verifier] | None = None,
          extra_infos: list[dict] | None = None, groups: list[int] | None = None,
          gate: tuple[str, ...] | list[str] = (), dtype: torch.dtype = torch.float64,
          prompts: list | None = None, model=None, functions: dict[str, Verifier] | None = None,
          completion_ids: list | None = None, data_sources: list[str] | None = None, judge=None) -> Scores:
    """total[i] = sum_k weights[k] * component_k(completions[i], ground_truths[i])
                  * prod_{g in gate} [component_g(completions[i], ground_truths[i]) > 0].

    The gate makes the sum all-or-nothing: with `gate=("format_r1_zero",)` and weights
    {correct: 1, format_r1_zero: 0} the reward is 1 only when the format is right and the
    answer is (ReasonRL's strict reward). Every component named in `weights` is computed and
    reported, weight 0 included, so it can be logged without shaping the reward; a gate must
    be one of them. `groups[i]` is sample i's prompt index (for `reward.batch_fn`; default:
    each sample its own). `correct` is sample i's task verifier (`verifiers[i]`; default: the
    numeric check); a name of `functions` (reward.fns) is that function's score; the other
    components are format checks. A component that raises scores 0
    for that sample and is counted in `errors`, one that runs past its timeout scores 0 and is
    counted in `timeouts`; `failures[i]` names the verifier of a row that failed and why. A bad
    ground truth raises `BadGroundTruth` (a GroundTruthError): that is a data bug. Sums are
    taken in Python floats; the tensors have `dtype`. `judge` and `classifier` are reward.model
    (`model`, a RewardModelConfig) reading `prompts[i]` and the completion in the judge role's
    worker (`judge`; `model_reward.score_with_model`), after the other components: a row that another gate
    component already zeroes is not sent to it (it scores 0 there, not counted as a failure).

    A TRL-style function that returns None for row i does not apply to it (TRL's rule, its
    `nansum` over the functions): its weighted score is left out of total[i], its component is 0
    there and `applied[name][i]` False (set for every component a TRL function scores). What
    the functions ask to log (verl's dict keys, OpenRLHF's extra_logs, TRL's log_metric) is
    `logged[i]`, each key under "<style>/" (reward.fn) or "<name>/" (a reward.fns entry).
    `prompts`, `completion_ids` and `data_sources` are what the styles other than reasonrl's
    read (None: "", ids not known, "unknown").
    """
    if len(completions) != len(ground_truths):
        raise ValueError(f"{len(completions)} completions but {len(ground_truths)} ground truths")
    functions = functions or {}
    unknown = [k for k in weights if k not in REWARD_COMPONENTS and k not in functions]
    if unknown:
        allowed = ", ".join((*REWARD_COMPONENTS.names(), *functions))
        raise ValueError(f"unknown reward weights {unknown}; allowed: {allowed}")
    ungated = [g for g in gate if g not in weights]
    if ungated:
        raise ValueError(f"reward gate {ungated} is not in the weights {list(weights)}: a gate must be "
                         "computed")
    n = len(completions)
    total, components, errors = [0.0] * n, {}, 0
    failures: list[str | None] = [None] * n
    timed_out, parts = [False] * n, [{} for _ in range(n)]
    applied: dict[str, list[bool]] = {}
    logged: list[dict[str, float]] = [{} for _ in range(n)]
    columns = dict(zip(COLUMNS, (completions, ground_truths,
                                 [int(g) for g in (groups if groups is not None else range(n))],
                                 extra_infos or [{} for _ in range(n)], prompts or [""] * n,
                                 completion_ids or [None] * n, data_sources or ["unknown"] * n), strict=True))
    for name, weight in weights.items():
        if is_model_component(name):
            continue  # below, on the rows the other gate components leave
        hits = [True] * n
        if name == "correct" or name in functions:
            if name == "correct":
                numeric = task_verifier("numeric", {"fallback_last_number": fallback_last_number})
                row_verifiers = verifiers = verifiers or [numeric] * n
            else:
                row_verifiers = [functions[name]] * n
            outcomes = _verify(row_verifiers, columns)
            scores = [0.0] * n
            for i, (v, out) in enumerate(zip(row_verifiers, outcomes, strict=True)):
                hits[i] = not out.not_applied
                scores[i], found, why = _read(out, v, n)
                if name == "correct":
                    parts[i] = found
                else:
                    parts[i].update({f"{name}/{k}": x for k, x in found.items()})
                if out.logged:
                    prefix = name if name in functions else v.style
                    logged[i].update({f"{prefix}/{k}": x for k, x in out.logged.items()})
                if why is not None:
                    failures[i] = failures[i] or f"{describe_verifier(v)}: {why}"
                    timed_out[i] = timed_out[i] or out.timed_out
                    if not out.timed_out:
                        errors += 1
            if any(v.style == "trl" for v in row_verifiers):
                applied[name] = hits
        else:
            fn, scores = make_reward_fn(name, fallback_last_number), []
            for i, (completion, truth) in enumerate(zip(completions, ground_truths, strict=True)):
                try:
                    scores.append(float(fn(completion, truth)))
                except GroundTruthError as err:
                    raise BadGroundTruth(str(err), i) from None
                except Exception:
                    scores.append(0.0)
                    errors += 1
        for i, s in enumerate(scores):
            if hits[i]:
                total[i] += weight * s
        components[name] = scores
    for name in [k for k in weights if is_model_component(k)]:
        passed = [i for i in range(n) if all(components[g][i] > 0 for g in gate if g in components)]
        scores, why, late = score_with_model(name, model, judge, prompts or [""] * n, completions,
                                             ground_truths, passed)
        for i, s in enumerate(scores):
            total[i] += weights[name] * s
            if why[i] is not None:
                errors, timed_out[i] = errors + (not late[i]), timed_out[i] or late[i]
                failures[i] = failures[i] or why[i]
        components[name] = scores
    components = {k: components[k] for k in weights}  # in the order of the weights
    for g in gate:
        for i, s in enumerate(components[g]):
            if s <= 0:
                total[i] = 0.0
    for i, t in enumerate(total):
        if not abs(t) <= MAX_ABS_REWARD:  # each score is bounded, a large weight may not be
            total[i] = 0.0
            if failures[i] is None:
                failures[i] = (f"reward.weights: ValueError: the weighted total {t:g} is beyond "
                               f"+-{MAX_ABS_REWARD:g} (weights {weights}); lower the weights")
                errors += 1
    return Scores(total=torch.tensor(total, dtype=dtype),
                  components={k: torch.tensor(v, dtype=dtype) for k, v in components.items()},
                  errors=errors, timeouts=sum(timed_out), failures=failures, timed_out=timed_out, parts=parts,
                  applied={k: torch.tensor(v, dtype=torch.bool) for k, v in applied.items()} or None,
                  logged=logged)


def gate_of(cfg) -> tuple[str, ...]:
    """The components that gate the total: `reward.gate`, or every weighted component with
    `reward.combine=all`."""
    return tuple(cfg.weights) if cfg.combine == "all" else tuple(cfg.gate)


def score_examples(completions: list[str], examples: list, cfg, always_correct: bool = False,
                   groups: list[int] | None = None, dtype: torch.dtype = torch.float64,
                   completion_ids: list[list[int]] | None = None, judge=None) -> Scores:
    """`score` for completions of `examples` (batch.Example) under a RewardConfig `cfg`.

    Each example's verifier comes from reward.batch_fn / reward.fn / reward.task / its
    data_source, and its `meta` is the verifier's `extra_info`; `groups[i]` is completion i's
    prompt index (`reward.batch_fn`); reward.fns are components of their names. The examples'
    prompts and data sources, and `completion_ids` (a TRL function's; None: not known), go to
    the functions whose style reads them; `judge` (the judge role's worker) scores `judge` or
    `classifier`. `always_correct` adds `correct` at weight 0 when the
    weights leave it out (evaluation always reports accuracy). A bad ground truth is reported
    with the example's origin (file:line), or the batch reward that raised it.
    """
    weights = dict(cfg.weights)
    if always_correct and "correct" not in weights:
        weights = {"correct": 0.0, **weights}
    cache: dict[str, Verifier] = {}
    for e in examples:
        if e.data_source not in cache:
            cache[e.data_source] = verifier_for(e.data_source, cfg)
    verifiers = [cache[e.data_source] for e in examples]
    try:
        return score(completions, [e.ground_truth for e in examples], weights, cfg.fallback_last_number,
                     verifiers=verifiers, extra_infos=[e.meta for e in examples], groups=groups,
                     gate=gate_of(cfg), dtype=dtype, prompts=[e.prompt for e in examples], model=cfg.model,
                     functions=function_verifiers(cfg), completion_ids=completion_ids,
                     data_sources=[e.data_source for e in examples], judge=judge)
    except BadGroundTruth as err:
        if err.row is None:  # raised by a batch reward function: no one record to name
            raise GroundTruthError(f"{err.function}: {err}") from None
        bad = examples[err.row]
        where = bad.meta.get("origin", bad.data_source)
        raise GroundTruthError(f"{where}: field 'ground_truth': {err}") from None


def score_rollouts(texts: list[str], examples: list, cfg, always_correct: bool = False,
                   groups: list[int] | None = None, completion_ids: list[list[int]] | None = None,
                   judge=None) -> Scores:
    """`score_examples` for a step's rollouts, in the float32 training computes in."""
    return score_examples(texts, examples, cfg, always_correct, groups, dtype=torch.float32,
                          completion_ids=completion_ids, judge=judge)
