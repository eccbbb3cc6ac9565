"""`reasonrl tool calculator|python 'ARGS' [--timeout S] [--memory-mb N] [--disk-mb N]
[--sandbox MODE]`: one tool call through the sandbox training uses, to debug a tool."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(sub) -> None:
    """The `tool` subcommand of the CLI's parser."""
    from reasonrl.registry import TOOLS
    from reasonrl.tools import SANDBOX_MODES

    p = sub.add_parser(
        "tool", help="run one tool call through the training sandbox, to debug a tool",
        description="Call a tool as an environment would and print its observation as JSON: output, "
                    "error, timed_out, seconds, exit_code, truncated, and the sandbox mode (auto: "
                    "bwrap, else unshare, else it refuses; bwrap: bubblewrap's namespaces; unshare: "
                    "util-linux unshare's namespaces and a private read-only root; rlimit, only when "
                    "chosen: resource limits and an unprivileged user, the host's files visible). ARGS is "
                    "the call's text, a JSON object ({\"code\": ...}), or - to read it from stdin. "
                    "Tools: " + "; ".join(f"{e.name}: {e.doc}" for e in TOOLS)
                    + ". See docs/tools.md for what each sandbox mode blocks.")
    p.add_argument("name", choices=TOOLS.names(), help="the tool")
    p.add_argument("arguments", metavar="ARGS", help="the call's arguments (text, JSON object, or -)")
    p.add_argument("--timeout", type=float, help="wall-clock seconds (default 10)")
    p.add_argument("--memory-mb", type=int, help="address space of the code's process in MB (default 512)")
    p.add_argument("--disk-mb", type=int, help="disk its directory may take, in MB (default 64)")
    p.add_argument("--sandbox", choices=SANDBOX_MODES, help="sandbox mode (default auto)")
    p.set_defaults(func=tool_command)


def tool_command(args: argparse.Namespace) -> int:
    """Run one tool call through the sandbox training uses and print its observation as JSON."""
    from reasonrl.errors import SandboxError
    from reasonrl.registry import TOOLS
    from reasonrl.tools import Limits, call_tool, sandbox_plan

    text = sys.stdin.read() if args.arguments == "-" else args.arguments
    arguments: str | dict = text
    if text.lstrip().startswith("{"):  # a chat template's tool call: {"code": "..."}
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            arguments = parsed
    chosen = {"timeout": args.timeout, "memory_mb": args.memory_mb, "disk_mb": args.disk_mb,
              "sandbox": args.sandbox}
    limits = Limits(**{k: v for k, v in chosen.items() if v is not None})
    mode = "parse (no code runs)"
    if TOOLS[args.name].sandboxed:  # probed before the call: its seconds are its own
        try:
            mode = sandbox_plan(limits.sandbox, limits.uid, limits.python).mode
        except SandboxError:  # the observation's error says why
            mode = "unavailable"
    observation = call_tool(args.name, arguments, limits)
    shown = {**observation.to_dict(), "seconds": round(observation.seconds, 4)}
    print(json.dumps({"tool": args.name, **shown, "mode": mode}), flush=True)
    return 0
