"""The rollout worker: turns examples into `Rollouts` with any engine.

It owns what every engine shares: prompt rendering and its length check, decoding of the
sampled ids, the group index, and the policy version its rollouts come from. A weight push
goes through `load_weights`, which checks by checksum (and, for engines that ask, a probe
sequence's log-probs) that the engine serves exactly the policy's weights.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from reasonrl import console
from reasonrl.batch import Example, Rollouts
from reasonrl.data import render_prompt
from reasonrl.envs import EnvSpec
from reasonrl.errors import ConfigError, DataError, PromptTooLong, WeightSyncError
from reasonrl.rollout.base import RolloutEngine, SamplingParams, prompt_seeds
from reasonrl.rollout.episodes import EpisodeRunner, ObservationEncoder
from reasonrl.weights import checksums_match


def where_of(example: Example) -> str:
    """How a message names a prompt: its file:line, else its first characters."""
    return example.meta.get("origin", repr(str(example.prompt)[:60]))


def prompt_cuts(rollout, examples: list[Example], max_prompt_tokens: int) -> list[int]:
    """Per example, the tokens its prompt has past `max_prompt_tokens` (0: it fits): what
    `data.truncate_prompts=left` cuts from its start. `rollout` is a rollout worker or its proxy."""
    return [max(0, len(rollout.encode(e, whole=True)) - max_prompt_tokens) for e in examples]


def check_prompt_lengths(rollout, examples: list[Example], max_prompt_tokens: int, shown: int = 10,
                         held_out: list[Example] | None = None) -> dict[str, int]:
    """Encode every example (a run's train set, then its `held_out` set; None: one set, as
    `reasonrl eval` has) through `rollout` (a rollout worker or its proxy, whose `encode` runs
    here): a DataError listing every prompt longer than `max_prompt_tokens` (the first `shown`
    with their file:line and length, then how many more), so that a run stops at start-up with
    all of them rather than at the first, or at step 500. Under `data.truncate_prompts=left`
    the worker cuts them instead (it does not raise for the first): nothing is raised, and since
    a cut prompt loses its start (a system prompt, the first lines of a question) without a word
    otherwise, one line says how many of each set are cut and by how many tokens at most.
    Returns {"train", "held_out": prompts cut, "most": tokens cut from one prompt}."""
    split, held_out = held_out is not None, held_out or []  # split: train (and held-out) prompts
    everything = examples + held_out
    cuts = prompt_cuts(rollout, everything, max_prompt_tokens)
    longer = [i for i, cut in enumerate(cuts) if cut > 0]
    summary = {"train": sum(c > 0 for c in cuts[:len(examples)]),
               "held_out": sum(c > 0 for c in cuts[len(examples):]), "most": max(cuts, default=0)}
    if not longer:
        return summary
    try:
        rollout.encode(everything[longer[0]])  # the worker's own rule: refused, or cut from the left
    except PromptTooLong:
        listed = "; ".join(f"{where_of(everything[i])} ({cuts[i] + max_prompt_tokens} tokens)"
                           for i in longer[:shown])
        more = f"; and {len(longer) - shown} more" if len(longer) > shown else ""
        raise DataError(f"{len(longer)} prompt(s) longer than data.max_prompt_tokens={max_prompt_tokens}: "
                        f"{listed}{more}. Raise data.max_prompt_tokens, shorten them, or cut them from the "
                        "left with data.truncate_prompts=left") from None
    most = max(longer, key=lambda i: cuts[i])
    sets = f"{summary['train']} of {len(examples)} {'train ' if split else ''}prompts"
    if held_out:
        sets += f" and {summary['held_out']} of {len(held_out)} held-out prompts"
    console.info(f"data.truncate_prompts=left: {sets} are longer than data.max_prompt_tokens="
                 f"{max_prompt_tokens} and are cut from the left, by at most {summary['most']} tokens "
                 f"({where_of(everything[most])})")
    return summary


def check_chat_observations(tokenizer, role: str, key: str = "env.observation_format=chat",
                            fix: str = "use env.observation_format=tagged") -> None:
    """ConfigError unless the tokenizer's chat template renders a `role` message after the
    model's turn (`env.observation_format=chat`, or an env.fn class's chat observations)."""
    try:
        ObservationEncoder(tokenizer).chat_text({"role": role, "content": "42"}, None)
    except ValueError as err:
        raise ConfigError(f"{key}: {err}; {fix}") from None


class RolloutWorker:
    """Renders prompts, plays the episodes (one engine turn each without an environment;
    `reasonrl.rollout.episodes`), and returns group-major `Rollouts`."""

    @classmethod
    def from_config(cls, cfg, host) -> RolloutWorker:
        """The rollout role: an engine (`rollout.engine`) over `model.path`'s model
        (`reasonrl.model.colocate.base_model`: the HF engine shares the policy's in one process,
        a plain copy with LoRA), computing in the precision's compute dtype; then the run's seed,
        so that an engine in a process of its own samples as the colocated one does (the trainer
        seeds after building the workers of its own process)."""
        from reasonrl.model.colocate import base_model
        from reasonrl.model.precision import cast_for_compute
        from reasonrl.rng import seed_everything
        from reasonrl.rollout.engines import make_engine

        model, tokenizer = base_model(cfg, host, "rollout")
        cast_for_compute(model, cfg.model.precision)  # a policy's model shared here is cast already
        engine = make_engine(cfg.rollout.engine, model, tokenizer, cfg.rollout, cfg.trainer.threads)
        worker = cls.encoder(cfg, tokenizer, engine)
        seed_everything(cfg.trainer.seed)
        return worker

    @classmethod
    def encoder(cls, cfg, tokenizer=None, engine: RolloutEngine | None = None) -> RolloutWorker:
        """A rollout worker rendering prompts as the run's do (`engine` None: it renders only,
        as the trainer's side of remote replicas does); `tokenizer` None: `model.path`'s."""
        from reasonrl.data import system_prompt_for
        from reasonrl.envs import environment_spec

        if tokenizer is None:
            from reasonrl.model.load import load_tokenizer

            tokenizer = load_tokenizer(cfg.model.path, cfg.model.revision)
        d = cfg.data
        return cls(engine, tokenizer, d.apply_chat_template, system_prompt_for(d), d.max_prompt_tokens,
                   d.truncate_prompts, env=environment_spec(cfg.env))

    def __init__(self, engine: RolloutEngine | None, tokenizer, apply_chat_template: bool = True,
                 system_prompt: str = "", max_prompt_tokens: int = 256, truncate_prompts: str = "error",
                 env: EnvSpec | None = None):
        self.engine, self.tokenizer = engine, tokenizer
        self.env = env  # the run's environment (reasonrl.envs.environment_spec); None = single-turn
        if env is not None and env.config.observation_format == "chat" and not env.config.fn:
            check_chat_observations(tokenizer, "tool" if env.name == "tool" else "user")
        for role in env.chat_roles if env is not None else ():  # an env.fn adapter's messages
            check_chat_observations(tokenizer, role, f"env.fn={env.name}", "its observations are chat "
                                    "messages: use a model whose chat template renders them")
        if env is not None and env.tools and not apply_chat_template:
            raise ConfigError(f"env.fn={env.name}: its tools are rendered into the prompt by the chat "
                              "template, which data.apply_chat_template=false leaves out; set it to true")
        self.tools = env.tools if env is not None else ()
        self.apply_chat_template, self.system_prompt = apply_chat_template, system_prompt
        self.max_prompt_tokens = max_prompt_tokens
        if truncate_prompts not in ("error", "left"):
            raise ValueError(f"truncate_prompts: {truncate_prompts!r}; allowed: error, left")
        self.truncate_prompts = truncate_prompts
        self.policy_version = 0  # the policy step whose weights the engine serves
        self.pushes = 0  # weight pushes so far (an engine may verify every k-th by a probe)

    def encode(self, example: Example, whole: bool = False) -> list[int]:
        """The prompt's token ids. Longer than `max_prompt_tokens`: `PromptTooLong` (a DataError
        naming the record), or with `truncate_prompts="left"` its last `max_prompt_tokens`
        tokens (TRL's left truncation: the end of the prompt, where the question and the
        generation prompt are, is kept). `whole`: all of them, unchecked (to count what is cut)."""
        text = render_prompt(example, self.tokenizer, self.apply_chat_template, self.system_prompt,
                             self.tools)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > self.max_prompt_tokens and not whole:
            if self.truncate_prompts == "left":
                return ids[-self.max_prompt_tokens:]
            where = where_of(example)
            raise PromptTooLong(f"{where}: prompt has {len(ids)} tokens, more than "
                                f"data.max_prompt_tokens={self.max_prompt_tokens}", where, len(ids))
        return ids

    def rollout(self, examples: list[Example], params: SamplingParams,
                seeds: list[int] | None = None) -> Rollouts:
        """`params.n` completions of each example; example i's sampled from `seeds[i]` alone
        (None: one seed per example drawn here from torch's RNG, `prompt_seeds`; greedy
        decoding draws none). Several replicas given the same seeds for their share of the
        examples return, together, what one worker returns for all."""
        prompts = [self.encode(e) for e in examples]
        if seeds is None and not params.greedy:
            seeds = prompt_seeds(len(prompts))
        if self.env is not None and self.env.runner:  # e.g. an agent program's (env.format=agent)
            from reasonrl.registry import EPISODE_RUNNERS

            return EPISODE_RUNNERS.get(self.env.runner)(self).run(examples, prompts, params, seeds,
                                                               self.policy_version)
        runner = EpisodeRunner(self.engine, self.tokenizer, self.env, self.encode)
        return runner.run(examples, prompts, params, seeds, self.policy_version)

    def probe_due(self) -> list[int] | None:
        """The probe token ids when the engine wants the coming push verified by log-probs,
        else None; the caller passes the policy's `reference_logprobs` of them as
        `expected_probe`."""
        return self.engine.probe_ids(self.pushes + 1)

    def load_weight_bucket(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """One bucket of a push that arrives in parts (ray mode's streamed sync): load it into
        the engine, unchecked. The push ends with `load_weights` (given its last bucket), whose
        checks cover the engine's whole weights."""
        self.engine.load_weights(named_tensors)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None,
                     expected_checksum: float | None = None,
                     expected_probe: torch.Tensor | None = None) -> None:
        """Push the policy's weights (of policy step `version`) into the engine. With
        `expected_checksum` (the policy's `weights_checksum`), check that the engine now
        serves exactly those weights and raise `WeightSyncError` if not: a rollout engine
        must never silently generate with stale weights. With `expected_probe` (the
        policy's log-probs of `probe_due()`'s ids) the engine's must match them too."""
        self.engine.load_weights(named_tensors)
        self.pushes += 1
        if expected_checksum is not None:
            served = self.engine.weights_checksum()
            if not checksums_match(served, expected_checksum):
                raise WeightSyncError(
                    f"weight sync to policy version {version}: the rollout engine "
                    f"({type(self.engine).__name__}) serves weights with checksum {served!r}, the "
                    f"policy's is {expected_checksum!r}; the push was skipped or incomplete")
        if expected_probe is not None:
            self.engine.check_probe(expected_probe, f"after pushing policy version {version}")
        if version is not None:
            self.policy_version = version

    def close(self) -> None:
        """Free the engine (vLLM's memory and process state); the worker is unusable after."""
        self.engine.close()
