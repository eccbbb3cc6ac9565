"""The token budget of a micro-batch (reasonrl/model/budget.py), hand-computed."""

from types import SimpleNamespace

import torch

from reasonrl.model.budget import activation_bytes_per_token, auto_budget, token_budget
from reasonrl.model.load import build_tiny_model

# SmolLM2-135M's shape
SMOLLM2_135M = SimpleNamespace(hidden_size=576, intermediate_size=1536, num_hidden_layers=30)
GIB = 2**30


def test_activation_bytes_per_token_of_smollm2_135m():
    # 4 bytes x 30 layers x 6 x (576 + 1,536) = 4 x 30 x 12,672
    assert activation_bytes_per_token(SMOLLM2_135M, torch.float32) == 1_520_640
    assert activation_bytes_per_token(SMOLLM2_135M, torch.bfloat16) == 760_320


def test_auto_budget_is_what_fits_or_keeps_the_device_busy():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    # 24 GiB / 8 / 1,520,640 = 2,118 positions fit; a CPU is busiest at 2,048
    assert auto_budget(SMOLLM2_135M, torch.float32, cpu, memory=24 * GIB) == 2048
    # 8 GiB: 706 fit -> 512 (a multiple of 256)
    assert auto_budget(SMOLLM2_135M, torch.float32, cpu, memory=8 * GIB) == 512
    # an 80 GiB GPU: 7,061 fit -> 6,912; in bfloat16 14,122 -> 14,080; 160 GiB in bf16: 28,244,
    # capped at 16,384
    assert auto_budget(SMOLLM2_135M, torch.float32, gpu, memory=80 * GIB) == 6912
    assert auto_budget(SMOLLM2_135M, torch.bfloat16, gpu, memory=80 * GIB) == 14080
    assert auto_budget(SMOLLM2_135M, torch.bfloat16, gpu, memory=160 * GIB) == 16384
    # never below 256 positions
    assert auto_budget(SMOLLM2_135M, torch.float32, cpu, memory=GIB) == 256


def test_a_configured_budget_wins_and_auto_sizes_the_model():
    model, _ = build_tiny_model(seed=0)
    cpu = torch.device("cpu")
    assert token_budget(model, cpu, 300) == 300
    assert token_budget(model, cpu, 0) == auto_budget(model.config, torch.float32, cpu)
    assert token_budget(torch.nn.Linear(2, 2), cpu, 0) == 0  # not a decoder: the row cap alone
