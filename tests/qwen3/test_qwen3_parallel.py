"""qwen3 under tensor and pipeline parallelism, through the real CLI in gloo processes.

One model holds both kinds of layer: ``debugmoe`` cut to 2 layers with layer 0 dense
(``mlp_only_layers=[0]``), so one TP run covers attention with QK-norm and GQA, the dense MLP
plan and a replicated MoE block, and one PP run puts the dense layer on stage 0 and the MoE
layer on stage 1 (the load figures then come from the other rank's stage). Both must
reproduce the single-process losses, gradient norms and expert-load figures of 4 steps
(fp32, the tolerance of the llama layouts in test_distributed_cli.py).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import Run, titan

TOLERANCE = 1e-5
STEPS = 4
COMMON = (
    "--spec", "qwen3", "--flavor", "debugmoe", "--qwen3.n_layers=2", "--qwen3.mlp_only_layers=[0]",
    "--training.seq_len=32", "--training.local_batch_size=4", f"--training.steps={STEPS}", "--metrics.log_freq=1",
    "--lr_scheduler.warmup_steps=1", "--training.max_norm=1.0", "--training.seed=0",
)
LAYOUTS = {
    "tp2": ("--parallelism.tp=2",),
    "pp2_1f1b": ("--parallelism.pp=2", "--parallelism.pp_schedule=1F1B"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    def launch(name: str) -> Run:
        args = LAYOUTS.get(name, ())
        return titan(tmp_path_factory.mktemp(name), *COMMON, *args, nproc=2 if args else None)

    names = ["single", *LAYOUTS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(names, pool.map(launch, names)))


def _records(run: Run, name: str) -> list[dict[str, float]]:
    return run.step_records(name, STEPS)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_single_process(name: str, runs: dict[str, Run]) -> None:
    reference, records = _records(runs["single"], "single"), _records(runs[name], name)
    assert reference[-1]["loss"] < reference[0]["loss"] - 0.1  # it learns
    for key in ("loss", "grad_norm"):
        diff = max(abs(r[key] - ref[key]) / abs(ref[key]) for r, ref in zip(records, reference))
        print(f"\n{name}: max relative {key} difference {diff:.3e}")
        assert diff < TOLERANCE, f"{name} {key}: {[r[key] for r in records]} vs {[r[key] for r in reference]}"
    # The bias update saw the same counts as one process: same loads, step after step.
    for r, ref in zip(records, reference):
        assert r["moe_load_imbalance"] == pytest.approx(ref["moe_load_imbalance"], rel=1e-12)
        assert r["moe_load_imbalance"] > 1.0


def test_tp_refuses_a_degree_that_does_not_divide_the_kv_heads(tmp_path: Path) -> None:
    run = titan(tmp_path, *COMMON, "--parallelism.tp=8", nproc=8)
    assert run.code == 2, run.text
    assert "parallelism.tp=8 does not divide model n_kv_heads=4" in run.text and "Traceback" not in run.text
