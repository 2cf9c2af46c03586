"""The conformance kit's quick checks on deepseek_v3's debug MoE flavor (import, meta build,
FLOPs/token against the matmuls really run, the HF round trip with stacked experts and the
routing bias, the loss falling), cut to 2 layers and 32-token windows to keep CI time down.

The full kit (``titan-plugin check deepseek_v3 --flavor debugmoe``: FSDP2, PP 2, EP 2, init
across layouts, resume) passes too; docs/writing-a-train-spec.md shows its table."""

from __future__ import annotations

from titan_core.testing import TrainSpecConformance


class TestDeepSeekV3MoE(TrainSpecConformance):
    train_spec = "deepseek_v3"
    flavor = "debugmoe"
    fast = True
    extra_flags = ("--deepseek_v3.n_layers=2", "--training.seq_len=32")
