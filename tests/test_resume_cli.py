"""Checkpoint and resume through the real CLI (``python -m titan_core``), one process and FSDP2 x2.

The interrupted runs are stopped the honest way: the same 20-step command, with
``--import fault_nonfinite`` (a test-only module, tests/faults/fault_nonfinite.py) and
``TITAN_TEST_NONFINITE_AT_STEP=11`` so that step 11's loss reads as NaN and the
run exits with code 3 after the checkpoint of step 10 was published. Rerunning
the command without the injection resumes at step 10 with the LR schedule,
data position and RNG of the uninterrupted run, so the 20 losses are compared
bit for bit. The two layouts use the same global batch (1 x 4 and 2 x 2 rows,
which the loader makes the same rows), so a checkpoint of one layout resumes
on the other and the losses agree within float32 reduction-order noise.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from one_process import run_in_one_process
from safetensors.torch import load_file

from titan_core.checkpoint import read_checkpoint_tensors

from conftest import REPO, CliResult, assert_user_error, run_cli

COMMON = (
    "--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=2", "--training.seq_len=32",
    "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=2", "--training.steps=20",
    "--checkpoint.enable=true", "--checkpoint.interval=5", "--checkpoint.keep_latest_k=2",
)
SINGLE = ("--training.local_batch_size=4",)
FSDP = ("--nproc-per-node", "2", "--parallelism.dp_shard=2", "--training.local_batch_size=2")
FAULTS = str(Path(__file__).resolve().parent / "faults")


def nan_at(step: int) -> dict[str, str]:
    """Environment that makes ``--import fault_nonfinite`` turn step ``step``'s loss into NaN."""
    return {"PYTHONPATH": os.pathsep.join([str(REPO), FAULTS]), "TITAN_TEST_NONFINITE_AT_STEP": str(step)}


STOP_AT_11 = nan_at(11)
NAN = ("--import", "fault_nonfinite")
LAYOUT_TOLERANCE = 1e-5  # measured: at most 3e-6 between the layouts over 20 steps


def train(run_dir: Path, layout: tuple[str, ...], *extra: str, env: dict[str, str] | None = None) -> CliResult:
    return run_cli(*COMMON, *layout, f"--job.run_dir={run_dir}", *extra, env=env)


def losses(run_dir: Path) -> dict[int, float]:
    """step -> loss from metrics.jsonl (appended by every segment; a re-run step's last record wins)."""
    out: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record:
            out[int(record["step"])] = record["loss"]
    return out


def checkpoint_names(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def snapshot(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    """path -> (size, mtime_ns, bytes) of every file under ``folder``."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def assert_ok(result: CliResult) -> None:
    assert result.code == 0, result.text
    assert "Traceback" not in result.text, result.text


# ---- runs shared by the module -------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_single(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CliResult]:
    run_dir = tmp_path_factory.mktemp("ref_single")
    result = train(run_dir, SINGLE)
    assert_ok(result)
    return run_dir, result


@pytest.fixture(scope="module")
def reference_fsdp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("ref_fsdp")
    assert_ok(train(run_dir, FSDP))
    return run_dir


@pytest.fixture(scope="module")
def single_stopped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CliResult]:
    run_dir = tmp_path_factory.mktemp("single_stopped") / "run"
    return run_dir, train(run_dir, SINGLE, *NAN, env=STOP_AT_11)


@pytest.fixture(scope="module")
def fsdp_stopped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CliResult]:
    run_dir = tmp_path_factory.mktemp("fsdp_stopped") / "run"
    return run_dir, train(run_dir, FSDP, *NAN, env=STOP_AT_11)


# ---- the non-finite guard -------------------------------------------------------------------


@pytest.mark.parametrize("stopped", ["single_stopped", "fsdp_stopped"])
def test_nonfinite_loss_stops_with_code_3_naming_the_step_and_keeps_the_checkpoint_before_it(
        stopped: str, request: pytest.FixtureRequest) -> None:
    run_dir, result = request.getfixturevalue(stopped)
    assert_user_error(result, "step 11: non-finite loss (loss=nan", "skip_nonfinite_steps", code=3)
    # the save of step 10 was published, nothing of step 11 exists, no temporary folder is left
    assert checkpoint_names(run_dir) == ["step-000005", "step-000010"]
    record = json.loads((run_dir / "checkpoints" / "step-000010" / "titan_checkpoint.json").read_text())
    assert record["step"] == 10 and record["world_size"] == (2 if stopped == "fsdp_stopped" else 1)
    assert max(losses(run_dir)) == 10  # step 11 was never logged


def test_skip_nonfinite_steps_completes_and_counts_the_skipped_step(tmp_path: Path) -> None:
    result = run_cli(*COMMON, *SINGLE, "--training.steps=6", "--checkpoint.enable=false",
                     "--training.skip_nonfinite_steps=true", f"--job.run_dir={tmp_path}", *NAN, env=nan_at(3))
    assert_ok(result)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["skipped_steps"] for r in records] == [0, 0, 1, 1, 1, 1]
    assert math.isnan(records[2]["loss"]) and all(math.isfinite(r["loss"]) for r in records[3:])


# ---- exact resume ---------------------------------------------------------------------------


def test_resume_on_one_process_is_bit_identical(single_stopped: tuple[Path, CliResult],
                                                reference_single: tuple[Path, CliResult], tmp_path: Path) -> None:
    run_dir = copy_run(single_stopped[0], tmp_path / "run")
    result = train(run_dir, SINGLE)
    assert_ok(result)
    assert f"resuming from {run_dir}/checkpoints/step-000010 at step 10" in result.text
    resumed, reference = losses(run_dir), losses(reference_single[0])
    assert sorted(resumed) == list(range(1, 21))
    assert resumed == reference  # exact float equality, all 20 steps


def test_resume_on_fsdp2_two_ranks_is_bit_identical(fsdp_stopped: tuple[Path, CliResult], reference_fsdp: Path,
                                                    tmp_path: Path) -> None:
    run_dir = copy_run(fsdp_stopped[0], tmp_path / "run")
    result = train(run_dir, FSDP)
    assert_ok(result)
    assert f"resuming from {run_dir}/checkpoints/step-000010 at step 10" in result.text
    resumed = losses(run_dir)
    assert sorted(resumed) == list(range(1, 21))
    assert resumed == losses(reference_fsdp)


def test_async_save_resumes_to_the_same_losses_as_sync(reference_fsdp: Path, tmp_path: Path) -> None:
    """FSDP2 x2 with background saves: the save of step 10 is published even though step 11 stops the run."""
    run_dir = tmp_path / "run"
    stopped = train(run_dir, FSDP, "--checkpoint.async_mode=async", *NAN, env=STOP_AT_11)
    assert stopped.code == 3, stopped.text
    assert checkpoint_names(run_dir) == ["step-000005", "step-000010"]
    result = train(run_dir, FSDP, "--checkpoint.async_mode=async")
    assert_ok(result)
    assert f"resuming from {run_dir}/checkpoints/step-000010 at step 10" in result.text
    assert losses(run_dir) == losses(reference_fsdp)  # the synchronous run's losses, bit for bit
    assert checkpoint_names(run_dir) == ["step-000015", "step-000020"]


# ---- resharding -----------------------------------------------------------------------------


def assert_close(got: dict[int, float], want: dict[int, float], steps: range) -> None:
    for step in steps:
        assert abs(got[step] - want[step]) <= LAYOUT_TOLERANCE, (step, got[step], want[step])


def resumed_losses(stopped: Path, layout: tuple[str, ...], tmp_path: Path) -> dict[int, float]:
    """The losses of a copy of ``stopped`` (checkpointed at step 10) resumed to step 20 under ``layout``."""
    run_dir = copy_run(stopped, tmp_path / "run")
    result = train(run_dir, layout)
    assert_ok(result)
    assert f"resuming from {run_dir}/checkpoints/step-000010 at step 10" in result.text
    return losses(run_dir)


def test_fsdp2_checkpoint_resumes_on_one_process(fsdp_stopped: tuple[Path, CliResult], reference_fsdp: Path,
                                                 reference_single: tuple[Path, CliResult], tmp_path: Path) -> None:
    resumed = resumed_losses(fsdp_stopped[0], SINGLE, tmp_path)
    assert_close(resumed, losses(reference_fsdp), range(11, 21))
    assert_close(resumed, losses(reference_single[0]), range(1, 21))


def test_one_process_checkpoint_resumes_on_fsdp2(single_stopped: tuple[Path, CliResult], reference_fsdp: Path,
                                                 reference_single: tuple[Path, CliResult], tmp_path: Path) -> None:
    resumed = resumed_losses(single_stopped[0], FSDP, tmp_path)
    assert_close(resumed, losses(reference_single[0]), range(11, 21))
    assert_close(resumed, losses(reference_fsdp), range(1, 21))


# ---- retention ------------------------------------------------------------------------------


def test_keep_latest_k_2_keeps_exactly_two_complete_checkpoints(reference_single: tuple[Path, CliResult]) -> None:
    run_dir, result = reference_single
    assert result.text.count("[checkpoint] saved checkpoint") == 4  # steps 5, 10, 15, 20
    assert checkpoint_names(run_dir) == ["step-000015", "step-000020"]
    for name in ("step-000015", "step-000020"):
        folder = run_dir / "checkpoints" / name
        record = json.loads((folder / "titan_checkpoint.json").read_text())
        assert sorted(p.name for p in folder.iterdir()) == ["__0_0.distcp", "tensor_index.json", "titan_checkpoint.json"]
        for file, digest in record["files"].items():
            assert (folder / file).stat().st_size == digest["size"], (name, file)


# ---- refusals -------------------------------------------------------------------------------


DIFFERENT_MODELS = [
    pytest.param(("--flavor", "debugmodel_gqa"),
                 ("with flavor 'debugmodel' but this run uses flavor 'debugmodel_gqa'", "--model.flavor=debugmodel"),
                 id="flavor"),
    pytest.param(("--llama3.n_layers=3",),
                 ("does not fit this model: parameter 'layers.2.", "exists in this model but not in the checkpoint"),
                 id="n_layers"),
    pytest.param(("--converters", "float8"),
                 ("written with converters [] but this run uses ['float8']", "--checkpoint.allow_converter_change=true"),
                 id="converters"),
    pytest.param(("--optimizer.param_groups=[{name='emb', patterns=['tok_embeddings.*'], lr_mult=0.5}]",),
                 ("written with other optimizer parameter groups: groups ['default', 'no_decay'] in the checkpoint "
                  "but ['default', 'emb', 'no_decay'] now", "--checkpoint.resume=never"),
                 id="param_groups"),
    pytest.param(("--optimizer.weight_decay=0.05",),
                 ("group 'default' has weight_decay=0.1 in the checkpoint but 0.05 now",), id="weight_decay"),
]


@pytest.fixture(scope="module")
def different_model_runs(reference_single: tuple[Path, CliResult], tmp_path_factory: pytest.TempPathFactory,
                         ) -> dict[str, tuple[Path, dict[str, tuple[int, int, bytes]], CliResult]]:
    """Each case's copy of the reference run, its files before, and titan-train's result resuming it with the
    case's flags: the refusals made one after the other in one process (one start-up, not five)."""
    root = tmp_path_factory.mktemp("different-models")
    copies = {case.id: copy_run(reference_single[0], root / case.id / "run") for case in DIFFERENT_MODELS}
    before = {name: snapshot(run_dir) for name, run_dir in copies.items()}
    commands = [(*COMMON, *SINGLE, f"--job.run_dir={copies[case.id]}", *case.values[0]) for case in DIFFERENT_MODELS]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    results = run_in_one_process(commands, module="titan_core.commands.titan_train", env=env, cwd=REPO)
    return {case.id: (copies[case.id], before[case.id], CliResult(proc.returncode, proc.stdout, proc.stderr))
            for case, proc in zip(DIFFERENT_MODELS, results, strict=True)}


@pytest.mark.parametrize(("flags", "fragments"), DIFFERENT_MODELS)
def test_resume_refuses_a_different_model(
        different_model_runs: dict[str, tuple[Path, dict[str, tuple[int, int, bytes]], CliResult]],
        request: pytest.FixtureRequest, flags: tuple[str, ...], fragments: tuple[str, ...]) -> None:
    run_dir, before, result = different_model_runs[request.node.callspec.id]
    assert_user_error(result, f"checkpoint {run_dir}/checkpoints/step-000020", *fragments)
    after = snapshot(run_dir)
    assert {name: after.get(name) for name in before} == before  # no existing file changed, config.toml included


def test_allow_converter_change_resumes_the_weights_with_float8(single_stopped: tuple[Path, CliResult],
                                                                reference_single: tuple[Path, CliResult],
                                                                tmp_path: Path) -> None:
    run_dir = copy_run(single_stopped[0], tmp_path / "run")
    result = train(run_dir, SINGLE, "--converters", "float8", "--checkpoint.allow_converter_change=true")
    assert_ok(result)
    assert "converters changed (['float8']): loaded the model weights from" in result.text
    assert f"resuming from {run_dir}/checkpoints/step-000010 at step 10" in result.text
    resumed, reference = losses(run_dir), losses(reference_single[0])
    assert sorted(resumed) == list(range(1, 21))
    # emulated float8 changes the numerics a little; a fresh model would start near 8.1, not 7.57
    assert abs(resumed[11] - reference[11]) < 0.05, (resumed[11], reference[11])
    assert all(math.isfinite(resumed[s]) for s in range(11, 21))


# ---- export ---------------------------------------------------------------------------------


def test_export_at_end_writes_bf16_safetensors_with_the_checkpoint_weights(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = train(run_dir, FSDP, "--training.steps=4", "--checkpoint.interval=4",
                   "--checkpoint.export_at_end=true", "--checkpoint.export_dtype=bfloat16")
    assert_ok(result)
    path = run_dir / "export" / "model.safetensors"
    assert f"exported the model weights (torch.bfloat16) to {path}" in result.text
    exported = load_file(str(path))
    folder = run_dir / "checkpoints" / "step-000004"
    shapes = json.loads((folder / "titan_checkpoint.json").read_text())["identity"]["param_shapes"]
    assert sorted(exported) == sorted(shapes) and "tok_embeddings.weight" in exported
    tensors = read_checkpoint_tensors(folder)  # the two FSDP shards assembled, after the manifest checks
    model = {key.removeprefix("model."): value for key, value in tensors.items() if key.startswith("model.")}
    for key, value in exported.items():
        assert value.dtype == torch.bfloat16 and list(value.shape) == shapes[key], key
        assert torch.equal(value, model[key].to(torch.bfloat16)), key
