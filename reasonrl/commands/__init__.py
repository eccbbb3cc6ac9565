"""The commands of `reasonrl`, one module per command: train, sft, data (prepare, traces), reward,
tool, report, eval, probe, calibrate.

Each module declares its own options (`add_parser(sub)`, which sets the function the command
runs as `func`) and holds what the command does; `reasonrl.cli` only builds the parser from
them, dispatches, and turns a failure into its one line and exit code. `evaluation.py` is
what `eval` and `probe` share (their options, the examples, building the workers); the
command modules do not import each other.
"""
