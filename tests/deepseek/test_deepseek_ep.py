"""Expert parallelism from a Hugging Face DeepSeek-V3 folder: EP 2 (two processes, each holding 4 of
the 8 experts of every MoE layer, with the folder's routing bias) against one process, through the
CLI: the same loss and gradient norm at every step (1e-6 relative), the same expert-load figures.
The one multi-process test of the deepseek_v3 spec; the kit's EP/FSDP2/PP checks run the debug flavor."""

from __future__ import annotations

import json
from pathlib import Path

from hf_deepseek import FULL, tiny_hf_deepseek

from conftest import run_main, titan

RUN = ("--spec", "deepseek_v3", "--training.steps=2", "--training.seq_len=32", "--metrics.log_freq=1",
       "--lr_scheduler.warmup_steps=1", "--training.seed=0", "--deepseek_v3.moe_bias_update_rate=0.01")


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_ep2_from_a_hf_folder_matches_one_process(tmp_path: Path, capsys) -> None:
    source = tiny_hf_deepseek(tmp_path / "hf", vocab=2048, **FULL)
    load = f"--checkpoint.initial_load={source}"
    one = run_main(capsys, *RUN, load, "--training.local_batch_size=4", f"--job.run_dir={tmp_path / 'one'}")
    ep2 = titan(tmp_path / "ep2", *RUN, load, "--parallelism.ep=2", "--training.local_batch_size=2", nproc=2)
    assert one.code == 0 and ep2.code == 0, one.text + ep2.text
    assert "ep:S(0)" in ep2.text
    a, b = _records(tmp_path / "one"), _records(tmp_path / "ep2")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    for x, y in zip(a, b):
        assert abs(x["loss"] - y["loss"]) <= 1e-6 * x["loss"] and abs(x["grad_norm"] - y["grad_norm"]) <= 1e-6 * x["grad_norm"]
        assert x["moe_load_imbalance"] == y["moe_load_imbalance"] >= 1.0
