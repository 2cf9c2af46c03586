"""The distributed runtime end to end, through the real CLI in real gloo processes.

Each layout trains the llama3 debug model (shrunk to 2 layers) for 5 steps on 2
processes, launched either by ``titan-train --nproc-per-node 2`` (the CLI
re-launches itself through torch.distributed.run) or by ``python -m
torch.distributed.run ... -m titan_core``, and must reproduce the per-step loss
and gradient norm that one process records in ``metrics.jsonl`` for the same
seed and the same global batch. Bad layouts must be refused with exit code 2
and one clear message before any worker starts.

Run with ``-s`` to see the measured differences per layout.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from one_process import run_in_one_process

from conftest import (
    DEBUG_LLAMA_2_LAYERS,
    PARITY_GLOBAL_BATCH,
    PARITY_SEQ_LEN,
    PARITY_TOLERANCE,
    REPO,
    CliResult,
    Run,
    titan as run_titan,
    torchrun as run_torchrun,
)

TOLERANCE = PARITY_TOLERANCE
STEPS = 5
# Global batch: 4 sequences of 32 tokens. Data-parallel layouts read 2 per rank.
GLOBAL_BATCH = PARITY_GLOBAL_BATCH
SEQ_LEN = PARITY_SEQ_LEN
COMMON = (
    *DEBUG_LLAMA_2_LAYERS,
    f"--training.steps={STEPS}", "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=1",
    "--training.max_norm=1.0", "--training.seed=0",
)


def titan(run_dir: Path, *args: str, nproc: int | None = None) -> Run:
    return run_titan(run_dir, *COMMON, *args, nproc=nproc)


def torchrun(run_dir: Path, *args: str, nproc: int = 2) -> Run:
    return run_torchrun(run_dir, *COMMON, *args, nproc=nproc)


def max_rel_diff(records: list[dict[str, float]], reference: list[dict[str, float]], key: str) -> float:
    return max(abs(r[key] - ref[key]) / abs(ref[key]) for r, ref in zip(records, reference))


@dataclass(frozen=True)
class Layout:
    name: str
    launcher: str  # "relaunch" (titan-train --nproc-per-node 2) or "torchrun"
    local_batch: int
    args: tuple[str, ...]


DP_BATCH = GLOBAL_BATCH // 2
LAYOUTS = [
    Layout("fsdp2", "relaunch", DP_BATCH, ("--parallelism.dp_shard=2",)),
    Layout("tp2_loss_parallel", "torchrun", GLOBAL_BATCH, ("--parallelism.tp=2", "--parallelism.loss_parallel=true")),
    Layout("pp2_1f1b", "relaunch", GLOBAL_BATCH, ("--parallelism.pp=2", "--parallelism.pp_schedule=1F1B")),
    Layout("pp2_gpipe", "torchrun", GLOBAL_BATCH,
           ("--parallelism.pp=2", "--parallelism.pp_schedule=GPipe", "--parallelism.pp_microbatches=4")),
    # Two accumulation micro-batches, each a schedule step of 2 microbatches: each step divides all the
    # gradients by 2, the earlier micro-batch's too (the trainer undoes that: pipeline_forward_backward).
    Layout("pp2_accumulation2", "relaunch", GLOBAL_BATCH // 2,
           ("--parallelism.pp=2", f"--training.global_batch_size={GLOBAL_BATCH}")),
    Layout("dp_replicate2", "relaunch", DP_BATCH, ("--parallelism.dp_replicate=2", "--parallelism.dp_shard=1")),
    Layout("fsdp2_ac_full", "torchrun", DP_BATCH, ("--parallelism.dp_shard=2", "--activation_checkpoint.mode=full")),
    Layout("fsdp2_ac_selective", "relaunch", DP_BATCH,
           ("--parallelism.dp_shard=2", "--activation_checkpoint.mode=selective")),
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, float]]:
    run = titan(tmp_path_factory.mktemp("single"), f"--training.local_batch_size={GLOBAL_BATCH}")
    assert run.code == 0, run.text
    records = run.records()
    # A reference that does not learn would match anything; clipping must be active to be tested.
    assert records[-1]["loss"] < records[0]["loss"] - 0.1
    assert all(r["grad_norm"] > 1.0 for r in records)
    return records


@pytest.fixture(scope="module")
def layout_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    # Made here, not in the threads: two first calls of mktemp at once race to create pytest's base folder.
    folders = {layout.name: tmp_path_factory.mktemp(layout.name) for layout in LAYOUTS}

    def launch(layout: Layout) -> Run:
        run_dir = folders[layout.name]
        args = (f"--training.local_batch_size={layout.local_batch}", *layout.args)
        return titan(run_dir, *args, nproc=2) if layout.launcher == "relaunch" else torchrun(run_dir, *args)

    # Two runs at a time: much of a run is process start-up and rendezvous, not compute.
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip((layout.name for layout in LAYOUTS), pool.map(launch, LAYOUTS)))


def _ok(run: Run, name: str) -> list[dict[str, float]]:
    return run.step_records(name, STEPS)


def test_a_zero_bubble_schedule_trains_as_one_process(tmp_path: Path) -> None:
    """ZBVZeroBubble (two stages per rank, 4 layers) runs each backward in two passes, the inputs' gradient then
    the weights', which the chunked loss cannot serve (it hands its gradients back once): the run used to stop at
    its first backward. The chunked loss is off under such schedules, said in one line."""
    four = ("--llama3.n_layers=4", "--training.steps=3", f"--training.local_batch_size={GLOBAL_BATCH}")
    one = titan(tmp_path / "one", *four)
    zbv = titan(tmp_path / "zbv", *four, "--parallelism.pp=2", "--parallelism.pp_stages_per_rank=2",
                "--parallelism.pp_schedule=ZBVZeroBubble", nproc=2)
    assert one.code == 0 and zbv.code == 0, one.text[-2000:] + zbv.text[-2000:]
    assert "chunked loss off: the ZBVZeroBubble schedule runs each backward in two passes" in zbv.text
    reference, records = one.records(), zbv.records()
    assert [r["step"] for r in records] == [r["step"] for r in reference] == [1, 2, 3]
    for key in ("loss", "grad_norm"):
        diff = max_rel_diff(records, reference, key)
        print(f"\nZBVZeroBubble: max relative {key} difference {diff:.3e}")
        assert diff < TOLERANCE, (key, records, reference)


@pytest.mark.parametrize("name", [layout.name for layout in LAYOUTS])
def test_losses_match_single_process(name: str, layout_runs: dict[str, Run], reference: list[dict[str, float]]) -> None:
    records = _ok(layout_runs[name], name)
    diff = max_rel_diff(records, reference, "loss")
    print(f"\n{name}: max relative loss difference {diff:.3e}")
    assert diff < TOLERANCE, (
        f"{name}: losses {[r['loss'] for r in records]} vs single process {[r['loss'] for r in reference]}"
    )


@pytest.mark.parametrize("name", [layout.name for layout in LAYOUTS])
def test_grad_norms_match_single_process(
    name: str, layout_runs: dict[str, Run], reference: list[dict[str, float]]
) -> None:
    # The norm is taken before clipping, over every rank's shards and stages.
    records = _ok(layout_runs[name], name)
    diff = max_rel_diff(records, reference, "grad_norm")
    print(f"\n{name}: max relative grad_norm difference {diff:.3e}")
    assert diff < TOLERANCE, (
        f"{name}: grad norms {[r['grad_norm'] for r in records]} vs single process "
        f"{[r['grad_norm'] for r in reference]}"
    )


@pytest.mark.parametrize("name", [layout.name for layout in LAYOUTS])
def test_only_rank0_reports(name: str, layout_runs: dict[str, Run]) -> None:
    run = layout_runs[name]
    records = _ok(run, name)
    step_lines = [line for line in run.out.splitlines() if line.startswith("step ")]
    assert len(step_lines) == STEPS, run.out  # one console line per step, not one per rank
    assert "[rank1]" not in run.text, run.text
    # A process still waiting for its peer after 3 s says so itself, naming its rank (runtime/waiting_notice.py):
    # on a loaded machine either rank may, in any layout. Every other line is rank 0's.
    progress = [line for line in run.err.splitlines() if "[titan]" in line and " is waiting for " not in line]
    assert progress and all(line.startswith("[rank0] [titan]") for line in progress), run.err
    # Every layout has two devices: the global token rate is twice each device's, and it
    # counts each global-batch token once (TP and PP ranks share their batch).
    for r in records:
        assert r["tokens_per_s_total"] == pytest.approx(2 * r["tokens_per_s"], rel=1e-12)
        assert r["tokens_per_s_total"] * r["step_time_s"] == pytest.approx(GLOBAL_BATCH * SEQ_LEN, rel=1e-9)


BAD_LAYOUTS = [
    pytest.param(2, ("--parallelism.tp=3",), "tp=3 x pp=1 = 3 does not divide world size 2", id="tp3_on_2"),
    pytest.param(None, ("--parallelism.dp_shard=2",), "dp_shard=2 x tp=1 x pp=1 = 2, but the world size is 1",
                 id="dp_shard2_on_1"),
    pytest.param(3, ("--parallelism.tp=3",), "parallelism.tp=3 does not divide model n_heads=16", id="tp_heads"),
    pytest.param(4, ("--parallelism.pp=4",), "pipeline has more stages than the model has layers: pp=4",
                 id="pp_gt_layers"),
    pytest.param(2, ("--parallelism.pp=2", "--parallelism.pp_schedule=ZigZag"),
                 'unknown pipeline schedule "ZigZag". Valid schedules: 1F1B, GPipe', id="unknown_schedule"),
    pytest.param(2, ("--parallelism.pp=2", "--parallelism.pp_microbatches=3", "--training.local_batch_size=4"),
                 "parallelism.pp_microbatches=3 does not divide training.local_batch_size=4", id="microbatches"),
]


@pytest.fixture(scope="module")
def bad_layout_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, CliResult]]:
    """Each bad layout's run folder and titan-train's result, the refusals made one after the other in one process
    (they come before any launch, so each pays no start-up but the one they share)."""
    root = tmp_path_factory.mktemp("bad-layouts")
    folders = {case.id: root / case.id / "run" for case in BAD_LAYOUTS}
    commands = [(*(("--nproc-per-node", str(nproc)) if nproc else ()), f"--job.run_dir={folders[case.id]}", *COMMON, *args)
                for case in BAD_LAYOUTS for nproc, args, _ in [case.values]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    results = run_in_one_process(commands, module="titan_core.commands.titan_train", env=env, cwd=REPO)
    return {case.id: (folders[case.id], CliResult(proc.returncode, proc.stdout, proc.stderr))
            for case, proc in zip(BAD_LAYOUTS, results, strict=True)}


@pytest.mark.parametrize("nproc, args, message", BAD_LAYOUTS)
def test_bad_layout_is_refused_before_launch(nproc: int | None, args: tuple[str, ...], message: str,
                                             request: pytest.FixtureRequest,
                                             bad_layout_runs: dict[str, tuple[Path, CliResult]]) -> None:
    run_dir, run = bad_layout_runs[request.node.callspec.id]
    assert run.code == 2, run.text
    assert message in run.err, run.err
    assert run.err.startswith("titan-train: error: "), run.err  # no rank prefix: no worker was started
    assert "[rank" not in run.text and "Traceback" not in run.text, run.text
    assert not run_dir.exists()  # refused before any set-up, let alone training
