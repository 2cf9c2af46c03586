"""``training.deterministic = true``: what cuBLAS and torch need for bit-reproducible steps.

cuBLAS picks reduction splits per stream unless ``CUBLAS_WORKSPACE_CONFIG`` fixes its
workspace, and torch then refuses the first matmul under deterministic algorithms; the
variable is read when cuBLAS makes its handle (the first matmul), so it is set here, at
set-up, before any step runs. A value the user set is kept. Ops without a deterministic
CUDA kernel are not used on this path: the MoE token counts come from the sorted routing
(``moe.layer.tokens_per_expert``), not ``torch.bincount``; any other such op stops the run
with torch's message naming it.
"""

from __future__ import annotations

import os

import torch

CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_VALUE = ":4096:8"  # the setting NVIDIA documents for reproducible cuBLAS results


def enable_deterministic() -> str:
    """Make the following steps deterministic; returns the line that says what was set."""
    set_here = CUBLAS_ENV not in os.environ
    if set_here:
        os.environ[CUBLAS_ENV] = CUBLAS_VALUE
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    cublas = f"{CUBLAS_ENV}={os.environ[CUBLAS_ENV]}" + ("" if set_here else " (yours, kept)")
    return (f"deterministic: torch.use_deterministic_algorithms(True), {cublas}; MoE token counts by sorted "
            "search (bincount has no deterministic CUDA kernel)")
