"""The one evaluation: the trainer's held-out eval and `reasonrl eval` / `probe` run it alike.

    metrics.py  pass@k, majority vote, the summary and the probe's verdict (pure, on tables)
    tables.py   the eval table, --compare, the probe verdict and the JSON reports (pure)
    loop.py     EvalSettings from the config's `eval` section, and `evaluate`: generate,
                score, read answers, measure entropy, through the worker protocols

The commands that build workers for it are in `reasonrl.commands` (`evaluation.py`), above placement.
"""

from reasonrl.evaluate.loop import EvalSettings, Evaluation, eval_settings, evaluate, record_plan
from reasonrl.evaluate.metrics import (
    ProbeThresholds,
    PromptResult,
    Verdict,
    by_source,
    episode_summary,
    eval_metrics,
    final_answer,
    majority_vote,
    pass_at_k,
    probe_metrics,
    probe_verdict,
    summarize,
)
from reasonrl.evaluate.tables import (
    compare_deltas,
    compare_rows,
    eval_report,
    format_compare,
    format_table,
    format_verdict,
    probe_report,
)

__all__ = [
    "EvalSettings", "Evaluation", "ProbeThresholds", "PromptResult", "Verdict", "by_source", "compare_deltas",
    "compare_rows", "episode_summary", "eval_metrics", "eval_report", "eval_settings", "evaluate",
    "final_answer", "format_compare", "format_table", "format_verdict", "majority_vote", "pass_at_k",
    "probe_metrics", "probe_report", "probe_verdict", "record_plan", "summarize",
]
