"""Where reasonrl keeps what it computes once per machine: converted models, tokenizers,
decoder calibrations. `$REASONRL_HOME`, default `~/.cache/reasonrl`.

And whether the Hugging Face Hub, which fills the Hugging Face caches of models and datasets,
can be reached now (`hub_unreachable`): asked once per process, in seconds, so that a machine
without network goes straight to those caches instead of retrying each request.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import urllib.parse
import urllib.request
from pathlib import Path

HUB_PROBE_SECONDS = 3.0  # one connection attempt to the Hub (or its proxy), name lookup included


def reasonrl_home() -> Path:
    return Path(os.environ.get("REASONRL_HOME", Path.home() / ".cache" / "reasonrl"))


def _connect(host: str, port: int, timeout: float) -> str | None:
    """None when a TCP connection to host:port opens within `timeout` seconds, else why not.
    The name lookup runs in a daemon thread too: a resolver with no network can take longer
    than the connect timeout, which does not cover it."""
    outcome: list[str | None] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(str(err) or type(err).__name__)

    thread = threading.Thread(target=attempt, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"no answer within {timeout:g} s"


@functools.cache
def hub_unreachable(timeout: float = HUB_PROBE_SECONDS) -> str | None:
    """None when the Hugging Face Hub (`HF_ENDPOINT`, default https://huggingface.co), or the
    proxy the environment names for it (`HTTPS_PROXY` and kin, `NO_PROXY` honoured), accepts a
    TCP connection within `timeout` seconds; else one line saying what could not be reached and
    why. One attempt per process (cached).

    huggingface_hub retries a request that cannot connect 5 times with waits of 1, 2, 4, 8 and
    8 s (`http_backoff`'s defaults, huggingface_hub/utils/_http.py), per file, before it falls
    back to its cache: 25-90 s on a machine without network, where `HF_HUB_OFFLINE=1` goes to
    the cache at once. Callers ask this first and go to the cache alone when the Hub is out of
    reach."""
    from huggingface_hub import constants

    endpoint = urllib.parse.urlsplit(constants.ENDPOINT)
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    what = f"the Hub ({host}:{port})"
    proxy = urllib.request.getproxies().get(endpoint.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        through = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if through.hostname:
            host, port = through.hostname, through.port or (443 if through.scheme == "https" else 80)
            what = f"the proxy to the Hub ({host}:{port})"
    why = _connect(host, port, timeout)
    return None if why is None else f"{what} cannot be reached ({why}; one try of {timeout:g} s)"
