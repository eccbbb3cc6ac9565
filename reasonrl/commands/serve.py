"""`reasonrl serve [CHECKPOINT] [--host H] [--port P] [--config C] [dotted.key=value ...]`: an
OpenAI-compatible endpoint over a model (`reasonrl.serve`), so any OpenAI-client harness can
evaluate a reasonrl checkpoint, with the token ids and the sampler's log-probs in each response.

CHECKPOINT is a run's `checkpoints/step_N` folder (served as policy version N), a run folder
(its newest checkpoint), an HF model folder, a Hub id, `tiny`, or nothing: the config's
`model.path` (the embedded SmolLM2-135M-Instruct by default). The engine is the one
`rollout.engine` names, over the model loaded as training loads it (`model.precision`'s load
and compute dtypes, `placement.device`); the config's system prompt and data settings are not
applied: a request's messages are rendered as sent.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from pathlib import Path

from reasonrl.console import info as say  # every [reasonrl] line goes through the console
from reasonrl.errors import ConfigError, MissingExtraError, ModelLoadError


def add_parser(sub) -> None:
    """The `serve` subcommand of the CLI's parser."""
    p = sub.add_parser(
        "serve", help="an OpenAI-compatible endpoint over a model or checkpoint (token ids and log-probs)",
        description="Serve /v1/chat/completions, /v1/completions and /v1/models over the config's rollout "
                    "engine until SIGINT or SIGTERM. Responses carry the prompt's and the completion's token "
                    "ids (vLLM's return_token_ids fields) and, with logprobs, the sampler's log-probs; "
                    "concurrent requests are batched into the engine's generate calls. docs/serve.md.")
    p.add_argument("checkpoint", nargs="?", default=None, metavar="CHECKPOINT",
                   help="runs/X/checkpoints/step_N, a run folder (its newest checkpoint), an HF folder, a "
                        "Hub id, `tiny`; default: the config's model.path (the embedded "
                        "SmolLM2-135M-Instruct)")
    p.add_argument("overrides", nargs="*", help="dotted.key=value config overrides (e.g. rollout.engine=hf)")
    p.add_argument("--config", help="a train config: its model and rollout sections are used")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this "
                                                         "machine only; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = a free one)")
    p.add_argument("--served-model-name", help="the `model` requests must name (default: CHECKPOINT as "
                                               "given, `tiny`, or SmolLM2-135M-Instruct)")
    p.add_argument("--max-tokens", type=int, default=512,
                   help="max_tokens of a request that gives none (cut to the context left; default 512)")
    p.add_argument("--batch-window-ms", type=float, default=5.0,
                   help="how long a request waits for others to share its generate call (default 5; 0 = "
                        "no batching)")
    p.add_argument("--max-batch-rows", type=int, default=64,
                   help="most sampled rows in one generate call (default 64; also the most n per request)")
    p.add_argument("--seed", type=int, help="seeds requests without a seed (default: trainer.seed)")
    p.set_defaults(func=serve_command)


def newest_checkpoint(path: str) -> tuple[str, int]:
    """(the model folder to load, the policy version it holds): a run folder's newest complete
    checkpoint, a checkpoint's own step, else (path, 0)."""
    from reasonrl.checkpoint.layout import STATE_FILE, list_checkpoints

    folder = Path(path).expanduser()
    if (folder / "checkpoints").is_dir():
        found = list_checkpoints(folder)
        if not found:
            raise ModelLoadError(f"{path}: a run folder without a complete checkpoint (checkpoints/step_N)")
        folder = found[-1]
        path = str(folder)
    state = folder / STATE_FILE
    if state.is_file():
        try:
            return path, int(json.loads(state.read_text()).get("step", 0))
        except (ValueError, TypeError):
            return path, 0
    return path, 0


def serving_engine(cfg):
    """(engine, tokenizer, context in positions) of a config whose model.precision is resolved:
    the model loaded and cast for compute on placement.device, in eval mode, under the engine
    `rollout.engine` names; the context is the model's, capped by the engine's own limit."""
    from reasonrl.config import resolve_device
    from reasonrl.model.load import load_model_and_tokenizer
    from reasonrl.model.precision import cast_for_compute, load_dtype
    from reasonrl.placement import model_positions
    from reasonrl.registry import ENGINES
    from reasonrl.rollout import make_engine

    positions = model_positions(cfg.model.path, cfg.model.revision)
    model, tokenizer = load_model_and_tokenizer(cfg.model.path, load_dtype(cfg.model.precision),
                                                seed=cfg.trainer.seed, revision=cfg.model.revision)
    model = cast_for_compute(model.to(resolve_device(cfg.placement.device)), cfg.model.precision).eval()
    context = positions[0] if positions else int(getattr(model.config, "max_position_embeddings", 2048))
    engine_limit, _ = ENGINES[cfg.rollout.engine].max_model_len(cfg.rollout)
    if engine_limit:
        context = min(context, engine_limit)
    engine = make_engine(cfg.rollout.engine, model, tokenizer, cfg.rollout, cfg.trainer.threads)
    return engine, tokenizer, context


def serve_command(args: argparse.Namespace) -> int:
    from reasonrl.config import load_config
    from reasonrl.model.load import DEFAULT_MODEL_NAME
    from reasonrl.placement import with_precision
    from reasonrl.serve import Endpoint
    from reasonrl.serve.app import Server, server_libraries_missing

    problem = server_libraries_missing()
    if problem:  # before the model loads
        raise MissingExtraError(problem)
    overrides, checkpoint = list(args.overrides), args.checkpoint
    if checkpoint is not None and "=" in checkpoint and not Path(checkpoint).exists():
        overrides, checkpoint = [checkpoint, *overrides], None  # `serve key=value`: no CHECKPOINT
    version = 0
    if checkpoint is not None:
        path, version = newest_checkpoint(checkpoint)
        overrides.append(f"model.path={path}")
    cfg = load_config(args.config, overrides)
    if cfg.placement.mode != "local":
        raise ConfigError("placement.mode: reasonrl serve runs its engine in this process; use "
                          "placement.mode=local")
    for value, option in ((args.max_tokens, "--max-tokens"), (args.max_batch_rows, "--max-batch-rows")):
        if value < 1:
            raise ConfigError(f"{option}: must be >= 1, got {value}")
    if args.batch_window_ms < 0:
        raise ConfigError(f"--batch-window-ms: must be >= 0, got {args.batch_window_ms}")
    cfg = with_precision(cfg)
    engine, tokenizer, context = serving_engine(cfg)
    name = args.served_model_name or (checkpoint if checkpoint is not None else cfg.model.path) \
        or DEFAULT_MODEL_NAME
    endpoint = Endpoint(engine, tokenizer, name, context, policy_version=version,
                        window_s=args.batch_window_ms / 1000, max_rows=args.max_batch_rows,
                        default_max_tokens=args.max_tokens,
                        seed=args.seed if args.seed is not None else cfg.trainer.seed)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server = Server(endpoint, args.host, args.port).start()
        say(f"serving {name} (policy version {version}, rollout.engine={cfg.rollout.engine}, context "
            f"{context} tokens) at {server.url} ; stop with Ctrl-C or SIGTERM", url=server.url, model=name,
            policy_version=version)
        try:
            while not stop.wait(0.5):
                pass
        finally:
            server.stop()
        say(f"stopped: {endpoint.batcher.jobs_served} prompts served in {endpoint.generate_calls} generate "
            "calls", prompts=endpoint.batcher.jobs_served, generate_calls=endpoint.generate_calls)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        endpoint.close()
        engine.close()
    return 0
