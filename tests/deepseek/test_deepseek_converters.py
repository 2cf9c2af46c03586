"""float8 and MX on deepseek_v3 (issue point: the converters take the MLA projections and the experts), through
the CLI in this process, emulated on CPU: every MLA projection of every layer and of the multi-token-prediction
block (MX leaves the one whose rows do not divide by its 32-value blocks) and every experts module is
converted, as the conversion table records, and 3 steps train to within a few percent of the unconverted loss."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import run_main

RUN = ("--spec", "deepseek_v3", "--flavor", "debugmoe", "--training.steps=3", "--training.seq_len=64",
       "--metrics.log_freq=1", "--deepseek_v3.mtp_layers=1")
MLA = ("wq_a", "wq_b", "wkv_a", "wkv_b", "wo")
CONVERTERS = {
    "float8": ("--converters", "float8", '--float8.moe_fqns=["experts"]'),
    "mx": ("--converters", "mx", '--mx.fqns=["attention"]', '--mx.moe_fqns=["experts"]'),
}


def _losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line]


@pytest.mark.parametrize("name", list(CONVERTERS))
def test_mla_projections_and_experts_are_converted_and_train(name: str, tmp_path: Path, capsys) -> None:
    plain = run_main(capsys, *RUN, f"--job.run_dir={tmp_path / 'plain'}")
    converted = run_main(capsys, *RUN, *CONVERTERS[name], f"--job.run_dir={tmp_path / name}")
    assert plain.code == 0 and converted.code == 0, plain.text + converted.text
    rows = json.loads((tmp_path / name / "conversion_table.json").read_text())
    modules = {row["module"] for row in rows if row["converter"] == name}
    # MX takes weights whose dims divide by its 32-value blocks: wkv_a (64 latent + 16 rotary = 80 rows) stays.
    expected = [p for p in MLA if not (name == "mx" and p == "wkv_a")]
    for layer in range(5):  # 4 layers and the prediction block (layer 4)
        assert {f"layers.{layer}.attention.{p}" for p in expected} <= modules, sorted(modules)
        assert (f"layers.{layer}.attention.wkv_a" in modules) == (name == "float8")
    assert {f"layers.{i}.moe.experts" for i in (1, 2, 3, 4)} <= modules  # layer 0 is dense (first_k_dense_replace)
    base, ours = _losses(tmp_path / "plain"), _losses(tmp_path / name)
    assert len(ours) == 3 and all(math.isfinite(x) for x in ours)
    assert all(abs(a - b) <= 0.03 * a for a, b in zip(base, ours)), (base, ours)
