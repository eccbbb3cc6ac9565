"""The `python` tool: run the model's code in the sandbox (`reasonrl.tools.sandbox`).

The arguments are the code itself, or {"code": "..."} (a chat template's tool call). What
the program prints (stdout and stderr, cut at `limits.output_bytes`) is the observation's
output; a failure (exception, exit code, signal, timeout, output flood, refused arguments)
also sets its error. The code only ever runs in the sandboxed child process.
"""

from __future__ import annotations

from typing import Any

from reasonrl.registry import TOOLS
from reasonrl.tools.base import ToolArgumentError, text_argument
from reasonrl.tools.sandbox import Limits, Observation, run_python


@TOOLS.register("python", doc='run Python code (standard library) in the sandbox; the code or {"code": ...}',
                sandboxed=True)
def python_tool(arguments: Any, limits: Limits) -> Observation:
    """Run the code in `arguments` in the sandbox under `limits` and return its observation."""
    try:
        code = text_argument(arguments, "code", max_chars=limits.code_chars)
    except ToolArgumentError as err:
        return Observation(error=f"python: {err}")
    return run_python(code, limits)
