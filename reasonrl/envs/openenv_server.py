"""An OpenEnv server as the environment (env.name=openenv, env.url=...): one WebSocket session
per episode (`reasonrl.envs.openenv_client` speaks the protocol), the server's /schema read once
at start-up and its session capacity probed against the episodes a rollout call plays at once.
The Action/Observation mapping (`Actions`, `Renderer`) is the in-process form's, in
`reasonrl.envs.openenv` (docs/env-openenv.md)."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

from reasonrl.batch import Example
from reasonrl.config import Config, EnvConfig
from reasonrl.envs.base import EnvStep
from reasonrl.envs.openenv import (
    EVAL_EPISODES_PER_CALL,
    Actions,
    Renderer,
    as_fields,
    loaded,
    reset_kwargs,
    schema_fields,
    text_field,
)
from reasonrl.envs.openenv_client import Session, endpoints, get_json, probe_sessions, websockets_connect
from reasonrl.errors import ConfigError
from reasonrl.registry import ENVIRONMENTS


class ServerEpisode:
    """One episode on an OpenEnv server: a WebSocket session of its own, opened at `reset`,
    closed at `end` (or, should the episode be dropped without it, when it is collected)."""

    def __init__(self, ws_url: str, actions: Actions, renderer: Renderer, show_reset: bool,
                 stop_strings: tuple[str, ...], open_timeout: float, timeout: float):
        self.ws_url, self.actions, self.renderer, self.show_reset = ws_url, actions, renderer, show_reset
        self.stop_strings, self.open_timeout, self.timeout = stop_strings, open_timeout, timeout
        self.session: Session | None = None
        self._closer: weakref.finalize | None = None

    def reset(self, example: Example) -> Example | None:
        self.session = Session(self.ws_url, self.open_timeout, self.timeout)
        self._closer = weakref.finalize(self, self.session.close, False)
        data = self.session.call("reset", reset_kwargs(example))
        return self.renderer.prompt(example, data.get("observation") or {}) if self.show_reset else None

    def step(self, turn: str) -> EnvStep:
        action = self.actions(turn)
        if action is None:
            return EnvStep(done=True)
        data = self.session.call("step", action if isinstance(action, dict) else as_fields(action))
        return self.renderer.step({**(data.get("observation") or {}), "reward": data.get("reward"),
                                   "done": data.get("done", False)})

    def end(self) -> None:
        if self.session is not None:
            self._closer.detach()
            self.session.close()
            self.session = None


_SERVERS: dict[tuple, Callable[[], ServerEpisode]] = {}  # a config's episode factory, its /schema read once


def server_key(cfg: EnvConfig) -> tuple:
    return (cfg.url, cfg.observation_format, cfg.step_timeout,
            tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in vars(cfg.openenv).items()))


def check_server(cfg: EnvConfig) -> None:
    """At start-up: the server answers `/health` and `/schema`, and its Action has a field for
    the turn (or env.openenv.parse_action is set); the episode factory is kept for the run."""
    o, where = cfg.openenv, f"env.url={cfg.url}"
    http, ws_url = endpoints(cfg.url)
    try:
        websockets_connect()
    except ImportError as err:
        raise ConfigError(f"{where}: {err}") from None
    try:
        get_json(f"{http}/health", o.connect_timeout)
        schema = get_json(f"{http}/schema", o.connect_timeout)
    except Exception as err:
        raise ConfigError(f"{where}: no OpenEnv server answers at {http} (/health, /schema): "
                          f"{type(err).__name__}: {err}") from None
    action = schema.get("action") if isinstance(schema, dict) else None
    if not isinstance(action, dict):
        raise ConfigError(f"{where}: {http}/schema holds no action schema; is it an OpenEnv server?")
    parse = loaded("parse_action", o.parse_action)
    what = f"{where}: its Action {action.get('title', '')}".strip()
    field = None if parse is not None else text_field(schema_fields(action), o.action_field, what)
    renderer = Renderer(o.observation_field, loaded("render", o.render), cfg.observation_format == "chat")
    # a step waits for its answer a little past env.step_timeout: the episode loop's timeout ends it first
    _SERVERS[server_key(cfg)] = functools.partial(
        ServerEpisode, ws_url, Actions(field, dict, parse), renderer, o.reset_observation,
        tuple(o.stop_strings), o.connect_timeout, cfg.step_timeout + 1.0)


def episodes_at_once(cfg: Config) -> tuple[int, str]:
    """The most episodes one rollout call of the run plays at once, and what sets that number:
    env.max_concurrent_episodes, else the larger of a training step's (trainer.batch_size) and
    a held-out eval call's (EVAL_EPISODES_PER_CALL, in whole prompts, at most data.val_size of them)."""
    e, n, batch = cfg.env, cfg.eval.n, cfg.trainer.batch_size
    if e.max_concurrent_episodes:
        return e.max_concurrent_episodes, f"env.max_concurrent_episodes={e.max_concurrent_episodes}"
    prompts = max(1, EVAL_EPISODES_PER_CALL // n)
    if cfg.data.val_size:
        prompts = min(prompts, cfg.data.val_size)
    train = (batch, f"a training step (trainer.batch_size={batch}: rollout.n={cfg.rollout.n} x "
                    f"{batch // cfg.rollout.n} prompts)")
    held_out = (prompts * n, f"a held-out eval call (eval.n={n} x {prompts} prompts: data.val_size="
                             f"{cfg.data.val_size or 'all'}, {EVAL_EPISODES_PER_CALL} episodes a call at "
                             "most)")
    return max(train, held_out, key=lambda x: x[0])


def check_sessions(cfg: Config) -> None:
    """At start-up, with the whole run's config: the server holds as many sessions at once as
    a rollout call plays episodes (`episodes_at_once`), probed by opening them (OpenEnv has no
    endpoint that reports its max_concurrent_envs) and closing them again. Refused in one line
    otherwise, naming the setting that queues episodes in waves the server can hold."""
    e = cfg.env
    needed, what = episodes_at_once(cfg)
    _, ws_url = endpoints(e.url)
    try:
        opened, refusal = probe_sessions(ws_url, needed, e.openenv.connect_timeout, e.step_timeout)
    except Exception as err:
        raise ConfigError(f"env.url={e.url}: opening a session failed: {type(err).__name__}: {err}") from None
    if refusal is None:
        return
    group = max(cfg.rollout.n, cfg.eval.n)
    fix = (f"set env.max_concurrent_episodes={opened} to queue them ({opened} at a time, whole prompts' "
           "groups), or start the server with a larger max_concurrent_envs" if opened >= group else
           f"that is fewer than one prompt's samples (rollout.n={cfg.rollout.n}, eval.n={cfg.eval.n}), which "
           "start together: start the server with a larger max_concurrent_envs")
    raise ConfigError(f"env.url={e.url}: the server holds {opened} sessions at once ({refusal}), but {what} "
                      f"plays {needed} episodes at once, one session each; {fix}")


@ENVIRONMENTS.register("openenv", doc="an OpenEnv server (env.url): one WebSocket session per episode",
                       check=check_server, check_run=check_sessions)
def openenv_server(cfg: EnvConfig) -> ServerEpisode:
    """A new episode on the server of `env.url` (`check_server` read its schema at start-up)."""
    key = server_key(cfg)
    if key not in _SERVERS:
        check_server(cfg)
    return _SERVERS[key]()
