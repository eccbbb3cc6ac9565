"""An OpenAI-compatible endpoint over the rollout engine, token-in/token-out.

- `protocol`: the wire format (requests checked into ids and sampling, responses, errors);
- `batcher`: concurrent requests batched into the engine's `generate` calls, the version guard;
- `calls`: what is recorded of every call (`CallRecord`, `CallLog`);
- `endpoint`: `Endpoint`, the core (a body in, a body out), without HTTP;
- `app`: FastAPI routes and the uvicorn `Server` (the `serve` extra), imported when used.

`reasonrl serve CHECKPOINT` (`reasonrl.commands.serve`) runs it for a model; docs/serve.md.
"""

from reasonrl.serve.batcher import Batcher, VersionMismatch
from reasonrl.serve.calls import CallLog, CallRecord
from reasonrl.serve.endpoint import Endpoint
from reasonrl.serve.protocol import RequestError

__all__ = ["Batcher", "CallLog", "CallRecord", "Endpoint", "RequestError", "VersionMismatch"]
