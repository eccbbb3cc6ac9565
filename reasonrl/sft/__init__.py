"""Supervised fine-tuning (`reasonrl sft`, docs/sft.md) on `train`'s machinery, and SFT data
from a run's or an eval's good answers (`reasonrl data traces`).

    records.py    SFT records ({prompt, completion} or {messages}) read and checked (file:line: field)
    rows.py       records as token rows through the chat template: prompt, completion, loss mask
    solutions.py  worked solutions a program writes for a task's problems (countdown, arithmetic)
    trainer.py    the SFT loop: the policy's Learner, the run directory, checkpoints, eval, tracking
    traces.py     a run's samples or an eval's completions that scored well, as SFT records
"""
