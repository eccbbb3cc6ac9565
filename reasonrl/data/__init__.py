"""Task data: `Example` records from files (JSONL, Parquet, `datasets` folders) or built-in
seeded generators (arithmetic, Countdown, the piecewise toy problem).

`load_examples(cfg.data, seed)` returns (train, held_out) lists (`data.task` is a
`DATA_TASKS` entry, `tasks.py`); `render_prompt` turns an example into the text the model
sees (chat template applied or not). `prepare.py` converts public datasets (GSM8K, MATH)
to files this loader reads.
"""

from reasonrl.data.arithmetic import arithmetic_examples, arithmetic_problem
from reasonrl.data.files import load_file, load_files, load_jsonl
from reasonrl.data.prompts import PromptSampler, render_prompt
from reasonrl.data.readers import iter_records
from reasonrl.data.tasks import load_examples, system_prompt_for, take_per_source
from reasonrl.errors import DataError

__all__ = ["DataError", "PromptSampler", "arithmetic_examples", "arithmetic_problem", "iter_records",
           "load_examples", "load_file", "load_files", "load_jsonl", "render_prompt", "system_prompt_for",
           "take_per_source"]
