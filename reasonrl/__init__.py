"""reasonrl: readable GRPO-family RL for language models on tasks a program can check."""

import os

# torch's OpenMP threads spin while idle by default; on a loaded 2-core machine that
# slowed a decode step from 0.3 s to 2-5 s. PASSIVE must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
