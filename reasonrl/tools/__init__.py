"""Tools a model can call during an episode, and the sandbox that runs model-written code.

- `sandbox/`: `run_python` runs code in a separate process under limits, in namespaces that
  show it only its directory and a read-only system (bubblewrap's, else util-linux unshare's
  with a private root; `auto` refuses to run where neither works), with memory and tasks
  bounded per call (a cgroup, else a watchdog); `sandbox_plan` says which, and why; `Limits`
  and the `Observation` a call returns.
- `base.py`: `call_tool(name, arguments, limits, stats)`, the one way to call a tool (never
  raises), and `ToolStats`, counts of calls for a caller that wants them (a custom
  environment, a script; the episode loop counts its own calls for the `env/tool_*` metrics).
- `calculator.py`, `python_tool.py`: the tools, registered in `reasonrl.registry.TOOLS`.

The tools know nothing of models or tokenizers: environments (above them) turn a model's
turn into a call and the observation into the next turn.
"""

from reasonrl.tools.base import ToolArgumentError, ToolStats, call_tool, text_argument
from reasonrl.tools.sandbox import (
    SANDBOX_MODES,
    CallBounds,
    Limits,
    Observation,
    SandboxPlan,
    run_python,
    sandbox_plan,
)

__all__ = ["SANDBOX_MODES", "CallBounds", "Limits", "Observation", "SandboxPlan", "ToolArgumentError",
           "ToolStats", "call_tool", "run_python", "sandbox_plan", "text_argument"]
