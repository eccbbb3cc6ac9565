"""Episodes: every rollout, single-turn or multi-turn, as one loop over turns.

All episodes of a batch advance turn by turn:

1. the engine samples a turn for every episode still going. Turn 1 is the engine call of a
   single-turn rollout: `n` samples of each prompt, from the prompt's seed. A later turn is one
   sample of each episode's trajectory so far, sent again as the prompt (inside the engine's
   `session`: the HF engine prefills only what follows the KV cache it kept, vLLM's prefix
   cache reuses its KV blocks), from `turn_seed` (the prompt's
   seed, the sample and the turn: an episode never depends on the batch it is in);
2. the turn's ids are appended exactly as the engine sampled them (mask 1; they are never
   decoded and re-encoded) and decoded once, for the environment and the logs;
3. each episode whose turn ended at EOS or a stop string takes one environment step; the
   steps of a turn run concurrently, each with `env.step_timeout` (`reasonrl.envs.run_calls`);
4. the observation (text, or a chat message rendered by the chat template) is tokenized and
   appended (mask 0), and the episode goes on unless the environment said it is done.

Limits: `env.max_turns` model turns; `rollout.max_new_tokens` model tokens in all; a turn's
`env.max_turn_tokens`; `env.max_total_tokens` model + environment tokens after the prompt.
A turn cut by one of them ends its episode, marked truncated; so does an episode still going
after its last turn, or whose next observation leaves no room for another model token.
`env.max_concurrent_episodes` bounds the episodes live at once (an environment server's
sessions): the prompts are played in waves of whole groups, one after the other.
An environment that raises or answers what is not an observation gives the episode an error
observation (counted in `step_errors`); one that hangs past the timeout ends the episode.

An environment's `reset` may set its episode's prompt (it returns an `Example`: TRL's and
Gymnasium's text from reset, SkyRL's `init`): the prompt is rendered again by the rollout
worker's `encode`, and turn 1 samples it (`_first_turn`). When the episode is over, however it
ended (but a hung step), its environment's `end()` runs, if it has one: a reward it returns is
added (TRL's `get_reward`), and the gym styles close there.

Without an environment (`env.name=none`) the loop ends after turn 1: a single-turn rollout
is the one-turn case, the same engine call and the same record (without `EpisodeStats`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from reasonrl.batch import EpisodeStats, Example, Rollouts, Turn
from reasonrl.envs import BadStep, EnvSpec, EnvStep, Outcome, as_step, observation_text, run_calls
from reasonrl.rollout.base import SEED_BOUND, Generation, RolloutEngine, SamplingParams

PLACEHOLDER = "REASONRL-TURN-PLACEHOLDER"  # stands for the model's turn when rendering a chat message


def turn_seed(seed: int, sample: int, turn: int) -> int:
    """The sampling seed of turn `turn` (2, 3, ...) of sample `sample` of a prompt whose seed is
    `seed`: the first 8 bytes of BLAKE2b("seed:sample:turn") mod SEED_BOUND. A function of the
    episode alone, so its turns do not depend on the batch or replica it runs in."""
    digest = hashlib.blake2b(f"{seed}:{sample}:{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % SEED_BOUND


def error_observation(message: str) -> str:
    """What the model reads when its environment failed."""
    return f"\n[environment error: {message}]\n"


class ObservationEncoder:
    """An observation -> the token ids appended after the model's turn. Text is tokenized as it
    is; chat messages ({"role", "content"}, one or a list) become what the tokenizer's chat
    template puts between the model's turn and the next one: the end of the model's message
    (unless its last token already is that end, e.g. EOS), the messages, and the generation
    prompt.

    Append-only: the conversation so far is never rendered again, only the new messages, after
    a placeholder assistant message (as TRL's `_get_tool_suffix_ids` and SkyRL's
    `get_obs_ids_from_obs` take the suffix of a minimal conversation). What the template does
    to earlier messages once others follow (Qwen3's strips `<think>...</think>` from assistant
    messages before the last user query; it renders the last one with an empty think block)
    cannot change the ids already in the trajectory: the model's turns stay the ids it sampled.
    Only the text after the placeholder is read, from the one rendering that holds the new
    messages."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def chat_text(self, message: dict | list[dict], last_id: int | None) -> str:
        """The text after a model turn ending with token `last_id` that adds `message` (or the
        messages of a list; ValueError when the chat template cannot render them after an
        assistant message)."""
        messages = message if isinstance(message, list) else [message]
        roles = "/".join(sorted({repr(m.get("role")) for m in messages}))
        base = [{"role": "user", "content": "?"}, {"role": "assistant", "content": PLACEHOLDER}]
        try:
            after = self.tokenizer.apply_chat_template([*base, *messages], tokenize=False,
                                                       add_generation_prompt=True)
        except Exception as err:
            raise ValueError(f"the chat template cannot render a {roles} message after the model's: "
                             f"{type(err).__name__}: {err}") from None
        if not isinstance(after, str) or after.count(PLACEHOLDER) != 1:
            raise ValueError(f"the chat template does not render the model's message as it is once a {roles} "
                             "message follows; use tagged observations")
        text = after[after.index(PLACEHOLDER) + len(PLACEHOLDER):]
        if last_id is not None:
            last = self.tokenizer.decode([last_id])
            if last and text.startswith(last):  # the model ended its message itself (EOS)
                text = text[len(last):]
        return text

    def encode(self, observation: str | dict | list[dict] | None, last_id: int | None) -> list[int]:
        if observation is None:
            return []
        text = observation if isinstance(observation, str) else self.chat_text(observation, last_id)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


COUNTS = ("tool_calls", "tool_errors", "tool_timeouts", "step_errors", "step_timeouts")  # EpisodeStats'


@dataclass
class Episode:
    """One row's trajectory while it is being played."""

    prompt: list[int]
    example: Example
    seed: int | None
    sample: int  # which of its prompt's n samples
    env: Any = None  # its environment (None: single-turn, or the environment failed to start)
    ids: list[int] = field(default_factory=list)  # after the prompt: model and environment ids
    mask: list[int] = field(default_factory=list)  # 1 on model ids
    logprobs: list[float] | None = field(default_factory=list)  # per id (0 on environment ids)
    turns: list[Turn] = field(default_factory=list)
    model_tokens: int = 0
    over: bool = False
    truncated: bool = False
    start_error: str | None = None  # why its environment did not start
    hung: bool = False  # a step ran past its timeout: the environment is asked nothing more
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    reward: float = 0.0


class EpisodeRunner:
    """Plays the episodes of one rollout call (see the module docstring)."""

    def __init__(self, engine: RolloutEngine, tokenizer, env: EnvSpec | None = None,
                 render: Callable[[Example], list[int]] | None = None):
        self.engine, self.tokenizer, self.env = engine, tokenizer, env
        self.encoder = ObservationEncoder(tokenizer)
        self.render = render  # an example -> its prompt's ids (an environment's reset may set the prompt)

    def run(self, examples: list[Example], prompts: list[list[int]], params: SamplingParams,
            seeds: list[int] | None, version: int) -> Rollouts:
        env = self.env
        limit = env.config.max_concurrent_episodes if env is not None else 0
        if limit and len(prompts) * params.n > limit:
            return self._waves(examples, prompts, params, seeds, version, max(1, limit // params.n))
        episodes = [Episode(p, e, None if seeds is None else seeds[k], s)
                    for k, (p, e) in enumerate(zip(prompts, examples, strict=True)) for s in range(params.n)]
        seconds = 0.0
        if env is not None:
            seconds += self._start(episodes)
        turn_cap = params.max_new_tokens
        if env is not None and env.config.max_turn_tokens:
            turn_cap = min(turn_cap, env.config.max_turn_tokens)
        stop = env.stop_strings if env is not None else ()
        # a turn continues the trajectory of the one before: the engine may reuse its KV cache
        with self.engine.session() if env is not None else contextlib.nullcontext():
            return self._play(episodes, prompts, params, seeds, version, seconds, turn_cap, stop)

    def _waves(self, examples: list[Example], prompts: list[list[int]], params: SamplingParams,
               seeds: list[int] | None, version: int, per: int) -> Rollouts:
        """`env.max_concurrent_episodes`: the prompts `per` at a time (whole groups: a prompt's `n`
        samples start together), each wave played to its end before the next starts, joined in
        order with their groups numbered on. Each prompt is sampled from its own seed, each later
        turn from `turn_seed`, so the waves play the episodes one call would (as rollout replicas
        that split a batch do)."""
        parts = []
        for start in range(0, len(prompts), per):
            part = self.run(examples[start:start + per], prompts[start:start + per], params,
                            None if seeds is None else seeds[start:start + per], version)
            part.group = part.group + start
            parts.append(part)
        return Rollouts.concat(parts)

    def _play(self, episodes: list[Episode], prompts: list[list[int]], params: SamplingParams,
              seeds: list[int] | None, version: int, seconds: float, turn_cap: int,
              stop: tuple[str, ...]) -> Rollouts:
        """The turns: every active episode generates, then every environment steps."""
        env = self.env
        active = list(range(len(episodes)))
        budgets = [self._budget(episodes[i], turn_cap, params.max_new_tokens) for i in active]
        gen = self._first_turn(episodes, prompts,
                               dataclasses.replace(params, max_new_tokens=budgets[0], stop=stop), seeds)
        turn = 1
        while True:
            self._record(episodes, active, gen, budgets)
            if env is None:
                break
            stepping = [i for i in active if not episodes[i].over]
            for i in stepping:
                if episodes[i].env is None:  # it failed to start: this turn was its only one
                    episodes[i].over = True
                    episodes[i].turns[-1] = dataclasses.replace(episodes[i].turns[-1],
                                                                error=episodes[i].start_error)
            stepping = [i for i in stepping if not episodes[i].over]
            t = time.perf_counter()
            outcomes = run_calls([_step_call(episodes[i]) for i in stepping], env.config.step_timeout,
                                 env.config.workers)
            seconds += time.perf_counter() - t
            for i, outcome in zip(stepping, outcomes, strict=True):
                self._apply(episodes[i], outcome, turn, params.max_new_tokens)
            active = [i for i in stepping if not episodes[i].over]
            if not active:
                break
            turn += 1
            budgets = [self._budget(episodes[i], turn_cap, params.max_new_tokens) for i in active]
            turn_seeds = None if params.greedy or seeds is None else \
                [turn_seed(episodes[i].seed, episodes[i].sample, turn) for i in active]
            turn_params = dataclasses.replace(params, n=1, max_new_tokens=max(budgets), stop=stop)
            gen = self.engine.generate([episodes[i].prompt + episodes[i].ids for i in active], turn_params,
                                       turn_seeds)
        if env is not None:
            seconds += self._end(episodes)
        return self._rollouts(episodes, len(prompts), params.n, version, seconds)

    def _first_turn(self, episodes: list[Episode], prompts: list[list[int]], params: SamplingParams,
                    seeds: list[int] | None) -> Generation:
        """Turn 1: `n` samples of each prompt from its seed, the single-turn call. Where the
        environments set their episodes' prompts (reset returned an `Example`), a prompt whose
        `n` episodes all got the same one is sampled the same way from it; one whose episodes
        got different prompts is no longer one prompt: each episode is sampled on its own, from
        `turn_seed(seed, sample, 1)` (still a function of the episode alone)."""
        n = params.n
        shared, own = {}, []  # prompt index -> the prompt its n episodes share; episodes on their own
        for k in range(len(prompts)):
            mine = [episodes[k * n + s].prompt for s in range(n)]
            if all(p == mine[0] for p in mine):
                shared[k] = mine[0]
            else:
                own += range(k * n, k * n + n)
        if not own:
            return self.engine.generate(list(shared.values()), params, seeds)
        rows: dict[int, tuple[list[int], bool, Any]] = {}  # episode -> (ids, truncated, log-probs)

        def keep(gen: Generation, which: list[int]) -> None:
            for j, i in enumerate(which):
                logprobs = None if gen.logprobs is None else gen.logprobs[j]
                rows[i] = (gen.completion_ids[j], gen.truncated[j], logprobs)

        if shared:
            gen = self.engine.generate(list(shared.values()), params,
                                       None if seeds is None else [seeds[k] for k in shared])
            keep(gen, [k * n + s for k in shared for s in range(n)])
        own_seeds = None if params.greedy or seeds is None else \
            [turn_seed(episodes[i].seed, episodes[i].sample, 1) for i in own]
        alone = dataclasses.replace(params, n=1)
        keep(self.engine.generate([episodes[i].prompt for i in own], alone, own_seeds), own)
        order = [rows[i] for i in range(len(episodes))]
        logprobs = None if any(r[2] is None for r in order) else [r[2] for r in order]
        return Generation([r[0] for r in order], [r[1] for r in order], logprobs)

    # ---- the steps of the loop ----------------------------------------------------------

    def _budget(self, ep: Episode, turn_cap: int, max_new_tokens: int) -> int:
        """Model tokens the episode's next turn may take under every limit (>= 1 by `_apply`)."""
        budget = min(turn_cap, max_new_tokens - ep.model_tokens)
        if self.env is not None and self.env.config.max_total_tokens:
            budget = min(budget, self.env.config.max_total_tokens - len(ep.ids))
        return budget

    def _start(self, episodes: list[Episode]) -> float:
        """Build and reset each episode's environment (concurrently, timed out like a step);
        one that fails leaves its episode single-turn, counted. Returns the seconds spent."""
        env = self.env

        def start(ep: Episode):
            def call() -> Any:
                instance = env.make()
                return instance, instance.reset(ep.example)
            return call

        t = time.perf_counter()
        outcomes = run_calls([start(ep) for ep in episodes], env.config.step_timeout, env.config.workers)
        for ep, outcome in zip(episodes, outcomes, strict=True):
            error = outcome.error
            if error is None:
                instance, example = outcome.value
                if isinstance(example, Example) and example != ep.example:  # the environment set the task
                    try:
                        if self.render is None:
                            raise ValueError("this rollout cannot render a prompt an environment sets")
                        ep.prompt, ep.example = self.render(example), example
                    except Exception as err:  # too long, or not renderable: as a failed start
                        error = f"its prompt: {type(err).__name__}: {err}"
            if error is None:
                ep.env = instance
            else:
                ep.start_error = f"the environment did not start: {error}"
                ep.counts["step_errors"] += 1
                ep.counts["step_timeouts"] += outcome.timed_out
        return time.perf_counter() - t

    def _end(self, episodes: list[Episode]) -> float:
        """Each finished episode's environment's `end()`, where it has one (concurrently, timed
        out like a step; not for an environment whose step hung: it is asked nothing more). A
        number it returns is added to the episode's reward (and its last turn's); one that
        raises, hangs or returns what is no finite number is counted in `step_errors`, as a
        step's failure. Returns the seconds spent."""
        ending = [ep for ep in episodes
                  if ep.env is not None and not ep.hung and callable(getattr(ep.env, "end", None))]
        if not ending:
            return 0.0
        t = time.perf_counter()
        cfg = self.env.config
        outcomes = run_calls([ep.env.end for ep in ending], cfg.step_timeout, cfg.workers)
        for ep, outcome in zip(ending, outcomes, strict=True):
            failure = outcome.error
            if failure is None:
                try:
                    reward = as_step(EnvStep(reward=outcome.value)).reward
                except BadStep as err:
                    failure = f"end(): {err}"
            if failure is not None:
                ep.counts["step_errors"] += 1
                ep.counts["step_timeouts"] += outcome.timed_out
                last = ep.turns[-1]
                ep.turns[-1] = dataclasses.replace(last, error="; ".join(
                    e for e in (last.error, f"the environment's end {failure}") if e))
            elif reward is not None:
                ep.reward += float(reward)
                ep.turns[-1] = dataclasses.replace(ep.turns[-1], reward=(ep.turns[-1].reward or 0.0) + reward)
        return time.perf_counter() - t

    def _record(self, episodes: list[Episode], active: list[int], gen, budgets: list[int]) -> None:
        """Append each active episode's sampled turn (cut at its own budget: the engine sampled
        up to the largest one) and decode it."""
        turns, cut = [], []
        for j in range(len(active)):
            ids, truncated = gen.completion_ids[j], gen.truncated[j]
            if len(ids) > budgets[j]:
                ids, truncated = ids[: budgets[j]], True
            turns.append(ids)
            cut.append(truncated)
        texts = self.tokenizer.batch_decode(turns, skip_special_tokens=True)
        for j, i in enumerate(active):
            ep, ids = episodes[i], turns[j]
            ep.ids += ids
            ep.mask += [1] * len(ids)
            if gen.logprobs is None or ep.logprobs is None:
                ep.logprobs = None
            else:
                ep.logprobs += gen.logprobs[j][: len(ids)].tolist()
            ep.model_tokens += len(ids)
            ep.turns.append(Turn(texts[j]))
            if cut[j]:
                ep.over = ep.truncated = True
            elif self.env is None:
                ep.over = True

    def _apply(self, ep: Episode, outcome: Outcome, turn: int, max_new_tokens: int) -> None:
        """The environment's answer to the episode's turn: counted, logged, and its observation
        appended when the episode goes on."""
        cfg = self.env.config
        failure = None
        if outcome.timed_out:  # the hung step still owns the environment: nothing more to ask it
            ep.counts["step_errors"] += 1
            ep.counts["step_timeouts"] += 1
            ep.hung = True
            ep.turns[-1] = dataclasses.replace(ep.turns[-1], error=f"environment step {outcome.error}")
            ep.over = ep.truncated = True
            return
        if outcome.error is not None:
            failure = f"the environment's step raised {outcome.error}"
        else:
            try:
                step = as_step(outcome.value)
            except BadStep as err:
                failure = str(err)
        if failure is not None:
            ep.counts["step_errors"] += 1
            step = EnvStep(observation=error_observation(failure))
        ep.counts["tool_calls"] += step.call is not None
        ep.counts["tool_errors"] += step.call is not None and step.error is not None
        ep.counts["tool_timeouts"] += step.call is not None and step.timed_out
        if step.reward is not None:
            ep.reward += float(step.reward)
        ep.turns[-1] = dataclasses.replace(ep.turns[-1], call=step.call, error=failure or step.error,
                                           observation=observation_text(step.observation), reward=step.reward)
        if step.done:
            ep.over = True
            return
        if turn >= cfg.max_turns or ep.model_tokens >= max_new_tokens:
            ep.over = ep.truncated = True
            return
        try:
            obs = self.encoder.encode(step.observation, ep.ids[-1] if ep.ids else None)
        except ValueError as err:
            ep.counts["step_errors"] += 1
            ep.turns[-1] = dataclasses.replace(ep.turns[-1], error=str(err))
            obs = self.encoder.encode(error_observation(str(err)), None)
        obs = obs[: cfg.max_observation_tokens]
        if cfg.max_total_tokens and len(ep.ids) + len(obs) >= cfg.max_total_tokens:
            ep.over = ep.truncated = True
            return
        ep.ids += obs
        ep.mask += [0] * len(obs)
        if ep.logprobs is not None:
            ep.logprobs += [0.0] * len(obs)

    def _rollouts(self, episodes: list[Episode], prompts: int, n: int, version: int,
                  seconds: float) -> Rollouts:
        logprobs = None
        if all(ep.logprobs is not None for ep in episodes):
            logprobs = [torch.tensor(ep.logprobs, dtype=torch.float32) for ep in episodes]
        stats = None
        if self.env is not None:
            counts = {name: torch.tensor([ep.counts[name] for ep in episodes], dtype=torch.long)
                      for name in COUNTS}
            stats = EpisodeStats(environment=self.env.name, turns=[ep.turns for ep in episodes], **counts,
                                 reward=torch.tensor([ep.reward for ep in episodes], dtype=torch.float32),
                                 seconds=seconds)
        return Rollouts(
            prompt_ids=[ep.prompt for ep in episodes],
            completion_ids=[ep.ids for ep in episodes],
            texts=[ep.turns[-1].model for ep in episodes],
            group=torch.arange(prompts).repeat_interleave(n),
            truncated=torch.tensor([ep.truncated for ep in episodes], dtype=torch.bool),
            examples=[ep.example for ep in episodes],
            sampler_logprobs=logprobs,
            policy_version=version,
            token_mask=[ep.mask for ep in episodes],
            episodes=stats,
        )


def _step_call(ep: Episode):
    text = ep.turns[-1].model

    def call() -> Any:
        return ep.env.step(text)
    return call
