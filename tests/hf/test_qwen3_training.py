"""qwen3 MoE training through the CLI: FSDP2 x2 and EP 2 from a Hugging Face Qwen3-MoE folder against
one process (same losses, same expert-load figures), the auxiliary loss and load in metrics.jsonl,
and float8 converting the dense linears of a MoE model (the stacked experts are not nn.Linear)."""

from __future__ import annotations

import json
from pathlib import Path

from test_qwen3_hf import tiny_hf_qwen3

from hf_helpers import GLOBAL_BATCH, titan

MOE = ("--spec", "qwen3", "--training.steps=3", "--qwen3.moe_aux_loss_coeff=0.01", "--qwen3.moe_bias_update_rate=0.01")


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_fsdp2_and_ep2_from_a_hf_moe_folder_match_one_process(tmp_path: Path) -> None:
    source = tiny_hf_qwen3(tmp_path / "hf", moe=True, tied=False, n_kv_heads=2, norm_topk_prob=True,
                           mlp_only_layers=[1], vocab=2048)
    one = titan(tmp_path / "one", *MOE, f"--checkpoint.initial_load={source}",
                f"--training.local_batch_size={GLOBAL_BATCH}")
    two = titan(tmp_path / "two", *MOE, f"--checkpoint.initial_load={source}", "--parallelism.dp_shard=2",
                f"--training.local_batch_size={GLOBAL_BATCH // 2}", nproc=2)
    # Expert parallelism: each rank reads only its 3 of the 6 experts' tensors of every layer.
    ep2 = titan(tmp_path / "ep2", *MOE, f"--checkpoint.initial_load={source}", "--parallelism.ep=2",
                f"--training.local_batch_size={GLOBAL_BATCH // 2}", nproc=2)
    assert one.code == 0 and two.code == 0 and ep2.code == 0, one.text + two.text + ep2.text
    assert "ep:S(0)" in ep2.text
    a, b, c = _records(tmp_path / "one"), _records(tmp_path / "two"), _records(tmp_path / "ep2")
    assert len(a) == len(b) == len(c) == 3
    for x, y in [*zip(a, b), *zip(a, c)]:
        assert abs(x["loss"] - y["loss"]) <= 1e-6 * abs(x["loss"])  # sequence-wise aux loss: layout-free
        assert x["moe_load_imbalance"] == y["moe_load_imbalance"]  # counts summed over the ranks
        assert abs(x["moe_aux_loss"] - y["moe_aux_loss"]) <= 1e-5 * x["moe_aux_loss"]
        assert x["moe_aux_loss"] > 0 and x["moe_load_imbalance"] >= 1.0
    assert "moe load max/mean" in one.out and "aux loss" in one.out


def test_float8_converts_the_dense_linears_of_a_moe_model(tmp_path: Path) -> None:
    run = titan(tmp_path / "run", "--spec", "qwen3", "--flavor", "debugmoe", "--qwen3.n_layers=2", "--training.steps=1",
                "--converters", "float8")
    assert run.code == 0, run.text
    rows = json.loads((tmp_path / "run" / "conversion_table.json").read_text())
    converted = {row["module"] for row in rows if row["converter"] == "float8"}
    # The attention projections; not the router (8 outputs: below float8's 16-multiple) nor the
    # experts (stacked parameters, no nn.Linear), nor the head (float8's default filter).
    assert converted == {f"layers.{i}.attention.{w}" for i in range(2) for w in ("wq", "wk", "wv", "wo")}
