"""The `env.openenv` section and `env.url`: an OpenEnv environment, in this process (`env.fn`, in
OpenEnv's style: `env.format=openenv`) or behind a server (`env.name=openenv env.url=...`), and
the rules across their keys. Docs: docs/env-openenv.md.

OpenEnv (github.com/meta-pytorch/OpenEnv, package `openenv-core`) types an environment's
input and output: `step(Action) -> Observation`, each a pydantic model (`Action`,
`Observation` in `openenv/core/env_server/types.py`; `Observation` carries `done` and
`reward`). These keys say how the model's turn becomes an Action and how an Observation
becomes the next message.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from reasonrl.config.fields import param
from reasonrl.errors import ConfigError

URL_SCHEMES = ("ws", "wss", "http", "https")  # OpenEnv's EnvClient turns http(s) into ws(s) (utils.py)


@dataclass
class OpenEnvConfig:
    # env.fn: its Action class, module:Class; "" = the annotation of step's `action` parameter
    action: str = ""
    # the Action field the model's turn fills; "" = its one text field (metadata aside)
    action_field: str = ""
    # instead: module:function(turn) -> an Action, a dict of its fields, or None (the episode is over)
    parse_action: str = ""
    # the Observation field whose text is the next message; "" = its one field besides done, reward and
    # metadata, or those fields as JSON
    observation_field: str = ""
    render: str = ""  # instead: module:function(observation fields: dict) -> text, a chat message or None
    stop_strings: list[str] = param([])  # strings that end a model turn besides EOS (a closing tag)
    # reset's observation, rendered as text, appended to the prompt's last user message (OpenEnv's loop
    # reads it before the first action); false: the prompt alone
    reset_observation: bool = True
    connect_timeout: float = param(10.0, gt=0)  # env.url: seconds to open a session (and to read /schema)


def openenv_rules(name: str, fn: str, style: str, url: str, o: OpenEnvConfig) -> None:
    """env.url with env.name=openenv (an OpenEnv server) and env.openenv.* with it or with an env.fn
    class in OpenEnv's style (`env.format=openenv`, or detected: `auto`)."""
    default = OpenEnvConfig()
    changed = [f"env.openenv.{k}" for k, v in vars(o).items() if v != getattr(default, k)]
    if url and name != "openenv":
        raise ConfigError(f"env.url: set, but env.name={name}; an OpenEnv server is env.name=openenv "
                          f"env.url={url}")
    if name == "openenv" and not url:
        raise ConfigError("env.url: env.name=openenv needs the server's URL (ws://host:port or "
                          "http://host:port); an OpenEnv Environment class in this process is "
                          "env.fn=path/file.py:Class")
    if changed and name != "openenv" and not (fn and style in ("auto", "openenv")):
        raise ConfigError(f"{', '.join(changed)}: set, but they configure an OpenEnv environment: "
                          "env.name=openenv with env.url, or an env.fn class with env.format=openenv")
    if url:
        parts = urlsplit(url)
        if parts.scheme not in URL_SCHEMES or not parts.hostname:
            raise ConfigError(f"env.url: {url!r} is not ws://host:port, wss://, http:// or https:// "
                              "(OpenEnv's EnvClient base_url)")
        if o.action:
            raise ConfigError("env.openenv.action: names a class in this process, but env.url runs the "
                              "environment on its server, whose /schema gives the Action's fields; remove it")
    for one, other in (("action_field", "parse_action"), ("observation_field", "render")):
        if getattr(o, one) and getattr(o, other):
            raise ConfigError(f"env.openenv.{one} and env.openenv.{other}: set one")
    for key in ("parse_action", "render", "action"):
        value = getattr(o, key)
        if value and (":" not in value or not all(value.rpartition(":")[::2])):
            raise ConfigError(f"env.openenv.{key}: expected module:name or path/file.py:name, got {value!r}")
    if any(not s for s in o.stop_strings):
        raise ConfigError("env.openenv.stop_strings: an empty string would end every turn at once")
