"""HTTP for the endpoint: FastAPI routes over `Endpoint`, run by uvicorn.

Why FastAPI + uvicorn: they are what vLLM's and SGLang's OpenAI servers use, so clients and
harnesses are tested against their behaviour (HTTP/1.1 keep-alive, JSON bodies, graceful
shutdown on SIGINT/SIGTERM); both are small, well kept and pure Python, and the `serve` extra
installs them (`pip install 'reasonrl[serve]'`). The standard library's http.server would do
for one client, but not for the hundreds of concurrent agent episodes the batcher exists for.

Routes: `/v1/models`, `/v1/chat/completions`, `/v1/completions`, `/health`, and the same three
under `/episodes/{key}/v1/` (the key is written into each `CallRecord.episode`: an episode runner
gives each agent its own base URL). Handlers read the body as JSON themselves and run the
blocking `Endpoint` call in a thread pool (`threads`, 40 by default: up to 40 requests wait on
the batcher at once, the others queue in the server; an episode runner's server has a thread for
every request its episodes can have waiting, since a round waits for all of them); every error
is OpenAI's JSON body
`{"error": {"message", "type", "param", "code"}}`, unknown paths and methods included.
"""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request)
# at definition time, and they name classes imported inside `make_app`
import json
import socket
import threading
import time

from reasonrl.errors import MissingExtraError
from reasonrl.serve.endpoint import Endpoint
from reasonrl.serve.protocol import RequestError


def server_libraries_missing() -> str | None:
    """Why the HTTP server cannot run here (fastapi or uvicorn missing), or None."""
    import importlib.util

    missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        return (f"the endpoint needs {' and '.join(missing)}: pip install 'reasonrl[serve]' "
                "(fastapi and uvicorn)")
    return None


def make_app(endpoint: Endpoint, threads: int = 40):
    """The FastAPI application serving `endpoint`, its blocking calls on at most `threads` threads."""
    problem = server_libraries_missing()
    if problem:
        raise MissingExtraError(problem)
    import anyio
    import anyio.to_thread
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(title="reasonrl", docs_url=None, redoc_url=None, openapi_url=None)
    limiter: list = []  # made in the server's event loop, on the first request

    async def in_thread(method, *args):
        if not limiter:
            limiter.append(anyio.CapacityLimiter(threads))
        return await anyio.to_thread.run_sync(method, *args, limiter=limiter[0])

    def error(err: RequestError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error(RequestError(f"{request.method} {request.url.path}: {exc.detail}", exc.status_code,
                                  kind=kind))

    async def serve(request: Request, method, episode: str | None) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except ValueError as err:
            return error(RequestError(f"the request body is not valid JSON: {err}"))
        try:
            return JSONResponse(await in_thread(method, body, episode))
        except RequestError as err:
            return error(err)
        except Exception as err:  # the engine failed: a server error with its reason
            return error(RequestError(f"{type(err).__name__}: {err}", 500, kind="server_error"))

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "policy_version": endpoint.policy_version}

    for prefix in ("/v1", "/episodes/{episode}/v1"):
        @app.get(f"{prefix}/models")
        async def models(episode: str | None = None) -> dict:
            return endpoint.models()

        @app.post(f"{prefix}/chat/completions")
        async def chat(request: Request, episode: str | None = None) -> JSONResponse:
            return await serve(request, endpoint.chat, episode)

        @app.post(f"{prefix}/completions")
        async def completions(request: Request, episode: str | None = None) -> JSONResponse:
            return await serve(request, endpoint.completions, episode)

    return app


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Server:
    """`endpoint` over HTTP at http://host:port (its calls on `threads` threads). `run()` serves
    in this thread until SIGINT or SIGTERM (uvicorn's handlers: in-flight requests finish, then
    it returns); `start()` serves from a background thread (tests, an episode runner) until
    `stop()`. Port 0: a free one."""

    def __init__(self, endpoint: Endpoint, host: str = "127.0.0.1", port: int = 8000,
                 log_level: str = "warning", threads: int = 40):
        problem = server_libraries_missing()
        if problem:
            raise MissingExtraError(problem)
        import uvicorn

        self.endpoint, self.host = endpoint, host
        self.port = port or free_port(host)
        config = uvicorn.Config(make_app(endpoint, threads), host=host, port=self.port, log_level=log_level,
                                access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The OpenAI base URL (`.../v1`)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def run(self) -> None:
        self.server.run()

    def start(self, timeout: float = 30.0) -> "Server":
        self._thread = threading.Thread(target=self.server.run, name="reasonrl-serve-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the endpoint did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
