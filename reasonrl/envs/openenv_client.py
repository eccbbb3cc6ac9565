"""OpenEnv's client protocol, written out: one WebSocket session per episode, the action schema
over HTTP, and a probe of how many sessions a server holds at once.

What an OpenEnv server (`openenv.core.env_server.http_server.HTTPEnvServer`, openenv-core
0.3.0) serves:

- `GET /health` -> {"status": "healthy"}; `GET /schema` -> {"action": <JSON schema>,
  "observation": ..., "state": ...} (the pydantic models' `model_json_schema()`);
- `WS /ws`: each connection is a session with an environment of its own, built when the
  connection opens (`_create_session`); the client sends {"type": "reset", "data": {kwargs}},
  {"type": "step", "data": {action fields}}, {"type": "state"} or {"type": "close"}, and gets
  {"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}} (the
  Observation serialized by `serialization.serialize_observation`: its fields less done,
  reward and metadata) or {"type": "error", "data": {"message": ..., "code": ...}};
- at most `max_concurrent_envs` sessions at once (`create_app(..., max_concurrent_envs=1)` by
  default; `ConcurrencyConfig`): one more gets the error CAPACITY_REACHED and is closed. No
  endpoint reports the limit, so `probe_sessions` opens sessions until the server refuses one.
  The stateless `POST /reset` and `POST /step` build a fresh environment per request
  (`reset_handler`, `step_handler`), so an episode of several steps needs the WebSocket.

The client mirrors `openenv.core.env_client.EnvClient` (http(s) turned into ws(s), "/ws"
appended: `openenv.core.utils.convert_to_ws_url`; a proxy bypassed for a loopback host) over
the `websockets` package's synchronous client, so a session is a plain object any thread
of `reasonrl.envs.run_calls` may use, with no event loop of its own.
"""

from __future__ import annotations

import inspect
import json
import urllib.request
from typing import Any
from urllib.parse import urlsplit, urlunsplit

LOOPBACK = ("127.0.0.1", "localhost", "::1")
CAPACITY_REACHED = "CAPACITY_REACHED"  # openenv.core.env_server.types.WSErrorCode


class ServerError(RuntimeError):
    """The server answered a message with {"type": "error"}: its code and message."""

    def __init__(self, code: str, message: str):
        super().__init__(f"the server answered {code}: {message}")
        self.code = code


def endpoints(url: str) -> tuple[str, str]:
    """(the HTTP base, the WebSocket URL) of a server's `env.url` (ws, wss, http or https)."""
    parts = urlsplit(url.rstrip("/"))
    secure = parts.scheme in ("wss", "https")
    http = urlunsplit(("https" if secure else "http", parts.netloc, parts.path, "", ""))
    ws = urlunsplit(("wss" if secure else "ws", parts.netloc, parts.path + "/ws", "", ""))
    return http, ws


def is_loopback(url: str) -> bool:
    return urlsplit(url).hostname in LOOPBACK


def get_json(url: str, timeout: float) -> Any:
    """GET `url` as JSON (no proxy for a loopback host, as OpenEnv's client does)."""
    handlers = [urllib.request.ProxyHandler({})] if is_loopback(url) else []
    with urllib.request.build_opener(*handlers).open(url, timeout=timeout) as answer:
        return json.loads(answer.read().decode())


def websockets_connect():
    """`websockets.sync.client.connect`, or ImportError naming what to install."""
    try:
        from websockets.sync.client import connect
    except ImportError:
        raise ImportError("env.url needs the websockets package (>= 13): pip install 'reasonrl[openenv]'") \
            from None
    return connect


class Session:
    """One WebSocket session with an OpenEnv server: one environment of its own, for one
    episode. Every call waits at most `timeout` seconds for the answer."""

    def __init__(self, ws_url: str, open_timeout: float, timeout: float):
        connect = websockets_connect()
        options: dict[str, Any] = {"open_timeout": open_timeout, "close_timeout": timeout,
                                   "max_size": 100 * 1024 * 1024}  # EnvClient's max_message_size_mb
        accepts = inspect.signature(connect).parameters
        if "proxy" in accepts and is_loopback(ws_url):  # websockets >= 15 reads proxies from the environment
            options["proxy"] = None
        if "legacy" in accepts:  # websockets >= 16: a connection returned directly, as before
            options["legacy"] = True
        self.timeout = timeout
        self.ws = connect(ws_url, **options)

    def call(self, kind: str, data: dict | None = None) -> dict:
        """Send a message of type `kind` and return the answer's data; ServerError for an
        error answer, TimeoutError past the timeout (the session is closed then),
        ConnectionError when the server closed the session."""
        from websockets.exceptions import ConnectionClosed

        message: dict[str, Any] = {"type": kind}
        if data is not None:
            message["data"] = data
        try:
            self.ws.send(json.dumps(message))
        except ConnectionClosed:  # it may have answered and closed already (a refused session): read on
            pass
        try:
            answer = json.loads(self.ws.recv(timeout=self.timeout))
        except TimeoutError:
            self.close(wait=False)
            raise TimeoutError(f"no answer to {kind} within {self.timeout:g} s") from None
        except ConnectionClosed as err:
            raise ConnectionError(f"the server closed the session ({err})") from None
        if answer.get("type") == "error":
            data = answer.get("data") or {}
            raise ServerError(str(data.get("code", "UNKNOWN")), str(data.get("message", "")))
        return answer.get("data") or {}

    def close(self, wait: bool = True) -> None:
        """End the session: {"type": "close"}, then (with `wait`) read until the server closes
        the connection, which it does after freeing the session (`_destroy_session` runs
        before its `websocket.close()`), so a session closed here no longer counts against its
        limit. Never raises."""
        try:
            if wait:
                self.ws.send(json.dumps({"type": "close"}))
                while True:
                    self.ws.recv(timeout=self.timeout)
        except Exception:  # ConnectionClosed (the end sought), a timeout, a broken connection
            pass
        try:
            self.ws.close()
        except Exception:
            pass


def open_session(ws_url: str, open_timeout: float, timeout: float) -> Session:
    """A new session whose environment the server has built: its `state` answered (a session
    refused for capacity, or whose environment the factory could not build, is answered with
    an error first: ServerError)."""
    session = Session(ws_url, open_timeout, timeout)
    try:
        session.call("state")
    except ServerError as err:
        if err.code == "EXECUTION_ERROR":  # its state fails before reset: the session exists all the same
            return session
        session.close(wait=False)
        raise
    except Exception:
        session.close(wait=False)
        raise
    return session


def probe_sessions(ws_url: str, needed: int, open_timeout: float, timeout: float) -> tuple[int, str | None]:
    """(how many sessions the server opened, up to `needed`, one after the other; why it
    refused the next one: None when it opened all). All of them are closed again, each
    waited for. Other errors (no server, an environment that cannot be built) raise."""
    sessions: list[Session] = []
    refusal = None
    try:
        while len(sessions) < needed:
            try:
                sessions.append(open_session(ws_url, open_timeout, timeout))
            except ServerError as err:
                if err.code != CAPACITY_REACHED:
                    raise
                refusal = str(err)
                break
    finally:
        for session in sessions:
            session.close()
    return len(sessions), refusal
