"""Tensor parallelism of the deepseek_v3 spec (tp_plan.py): TP 2 (two processes, the latent attention split
by heads, the down-projections replicated, MoE blocks replicated) against one process, from Hugging Face
folders with and without the query bottleneck: the same loss and gradient norm at every step (1e-6
relative). Without the summed rotary-key gradient the losses part by about 5e-6 relative by step 3. The
folder without the bottleneck also runs expert tensor parallelism (``parallelism.etp=2``: each routed
expert's hidden width split over the two tp ranks, w2 sharded on its dim 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hf_deepseek import FULL, PLAIN, tiny_hf_deepseek

from conftest import run_main, titan

RUN = ("--spec", "deepseek_v3", "--training.steps=4", "--training.seq_len=32", "--metrics.log_freq=1",
       "--lr_scheduler.warmup_steps=1", "--training.seed=0", "--deepseek_v3.moe_bias_update_rate=0.01",
       "--training.local_batch_size=2")


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


@pytest.mark.parametrize("shape", ["bottleneck", "plain"])
def test_tp2_matches_one_process(shape: str, tmp_path: Path, capsys) -> None:
    source = tiny_hf_deepseek(tmp_path / "hf", vocab=2048, **(FULL if shape == "bottleneck" else PLAIN))
    load = f"--checkpoint.initial_load={source}"
    one = run_main(capsys, *RUN, load, f"--job.run_dir={tmp_path / 'one'}")
    etp = ("--parallelism.etp=2",) if shape == "plain" else ()
    tp2 = titan(tmp_path / "tp2", *RUN, load, "--parallelism.tp=2", *etp, nproc=2)
    assert one.code == 0 and tp2.code == 0, one.text + tp2.text
    assert "tp:S(0)" in tp2.text and "tp:S(1)" in tp2.text  # the projections really are split
    assert ("tp:S(2)" in tp2.text) == bool(etp)  # only ETP splits the experts' w2 on its hidden dim
    a, b = _records(tmp_path / "one"), _records(tmp_path / "tp2")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        assert abs(x["loss"] - y["loss"]) <= 1e-6 * x["loss"], (x, y)
        assert abs(x["grad_norm"] - y["grad_norm"]) <= 1e-6 * x["grad_norm"], (x, y)
        assert x["moe_load_imbalance"] == y["moe_load_imbalance"] >= 1.0


def test_tp_must_divide_the_heads() -> None:
    from titan_core import ConfigError, ParallelismSection, TrainingSection
    from titan_deepseek.flavors import deepseek_v3_flavors
    from titan_deepseek.parallelize import validate_deepseek_v3_layout

    args = deepseek_v3_flavors["debugmodel"]  # 8 heads
    with pytest.raises(ConfigError, match=r"parallelism\.tp=3 does not divide model n_heads=8"):
        validate_deepseek_v3_layout(args, parallelism=ParallelismSection(tp=3), training=TrainingSection(seq_len=48),
                                    world_size=3)
    validate_deepseek_v3_layout(args, parallelism=ParallelismSection(tp=2), training=TrainingSection(seq_len=48),
                                world_size=2)
