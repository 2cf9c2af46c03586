"""The loss, the gradient norm and every other device value are read on the host only on the steps that need them.

On an accelerator, ``float(loss)`` waits for the step to finish; the Trainer reads the
loss and the gradient norm only on logging, checkpoint, validation and last steps, or on
every step with ``training.skip_nonfinite_steps`` (finite_watch.py). A spy module
(tests/faults/count_host_reads.py) records at which steps they were read, in real runs.
A NaN on a step that is not read stops the run at the next reading step, naming it,
with nothing of it saved. A second spy (tests/faults/count_device_reads.py) follows every
tensor derived from the model or made on the device and counts its host reads per step: 0 on
a non-logging step, dense and MoE (before issue 29: 8 per step for a 2-layer MoE model).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import REPO, assert_user_error, run_cli

FAULTS = str(Path(__file__).resolve().parent / "faults")
COMMON = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=32",
          "--training.local_batch_size=2", "--training.steps=10", "--metrics.log_freq=4", "--metrics.report=false")


def read_steps(tmp_path: Path, *extra: str, nan_at: int = 0) -> tuple[set[int], object]:
    reads = tmp_path / "reads.json"
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), FAULTS]), "TITAN_TEST_HOST_READS": str(reads),
           "TITAN_TEST_NONFINITE_AT_STEP": str(nan_at)}
    imports = ("--import", "count_host_reads") + (("--import", "fault_nonfinite") if nan_at else ())
    result = run_cli(*COMMON, f"--job.run_dir={tmp_path / 'run'}", *imports, *extra, env=env)
    return set(json.loads(reads.read_text())) if reads.exists() else set(), result


def test_loss_is_read_only_on_logging_checkpoint_and_last_steps(tmp_path: Path) -> None:
    steps, result = read_steps(tmp_path, "--checkpoint.enable=true", "--checkpoint.interval=6")
    assert result.code == 0, result.text  # type: ignore[attr-defined]
    assert steps == {1, 4, 6, 8, 10}  # log_freq 4 (and step 1), the save at 6, the last step


def test_skip_nonfinite_steps_reads_every_step(tmp_path: Path) -> None:
    steps, result = read_steps(tmp_path, "--training.skip_nonfinite_steps=true")
    assert result.code == 0, result.text  # type: ignore[attr-defined]
    assert steps == set(range(1, 11))


def test_nan_on_an_unread_step_stops_at_the_next_read_naming_it_and_saves_nothing_of_it(tmp_path: Path) -> None:
    _, result = read_steps(tmp_path, "--checkpoint.enable=true", "--checkpoint.interval=2", nan_at=3)
    assert_user_error(result, "step 3: non-finite loss or gradient norm, found at step 4",  # type: ignore[arg-type]
                      "the last checkpoint holds the last good state", code=3)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-000002"]
    logged = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1]


def device_reads(tmp_path: Path, *args: str, ranks: int = 1) -> list[dict[str, dict[int, int]]]:
    """Per rank, {"same": {step: reads}, "lagged": {step: reads}} of a 10-step run logging every 5 steps
    (faults/count_device_reads.py): reads of a value made in that step, and of one made in an earlier step."""
    reads = tmp_path / "device_reads.json"
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), FAULTS]), "TITAN_TEST_DEVICE_READS": str(reads)}
    result = run_cli(*args, "--training.seq_len=32", "--training.local_batch_size=2", "--training.steps=10",
                     "--metrics.log_freq=5", "--metrics.report=false", f"--job.run_dir={tmp_path / 'run'}",
                     "--import", "count_device_reads", env=env)
    assert result.code == 0, result.text  # type: ignore[attr-defined]
    files = [reads] + [reads.with_name(f"{reads.name}.rank{rank}") for rank in range(1, ranks)]
    return [{kind: {int(step): n for step, n in counts.items()} for kind, counts in json.loads(f.read_text()).items()}
            for f in files]


def test_no_device_value_is_read_on_a_non_logging_step_dense_and_moe(tmp_path: Path) -> None:
    # Every read of a device value waits for the accelerator: only the logging steps (1, 5, 10) may read.
    [dense] = device_reads(tmp_path / "dense", "--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1")
    # (A logging step also reads the finite watch, last written in an earlier step: a "lagged" read.)
    assert set(dense["same"]) == {1, 5, 10} and set(dense["lagged"]) <= {1, 5, 10}, dense
    # Throughput over the logging window: the mean step time of the steps since the last record.
    records = [json.loads(line) for line in (tmp_path / "dense" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["window_steps"]) for r in records] == [(1, 1), (5, 4), (10, 5)]
    assert all(r["tokens_per_s"] == 2 * 32 / r["step_time_s"] for r in records)
    # MoE: the auxiliary loss, the load counts, the bias update and the load figures stay on the device.
    [moe] = device_reads(tmp_path / "moe", "--spec", "qwen3", "--flavor", "debugmoe", "--qwen3.n_layers=2",
                         "--qwen3.moe_aux_loss_coeff=0.01", "--qwen3.moe_bias_update_rate=0.001")
    assert set(moe["same"]) == {1, 5, 10} and set(moe["lagged"]) <= {1, 5, 10}, moe


def test_two_ranks_read_their_stop_vote_one_step_late_on_non_logging_steps(tmp_path: Path) -> None:
    """The ranks' SIGTERM vote (train/stop_vote.py) is an all_reduce each step. On a non-logging step it is
    read one step late: a read of the previous step's vote, never a wait for this step's work."""
    ranks = device_reads(tmp_path, "--nproc-per-node", "2", "--parallelism.dp_shard=2", "--spec", "llama3",
                         "--flavor", "debugmodel", "--llama3.n_layers=1", ranks=2)
    for reads in ranks:
        assert set(reads["same"]) == {1, 5, 10}, reads  # logging steps (and the first): the vote read at once
        # Steps 2-4 and 6-9 cast a vote that the step after reads: one read, of the previous step's value.
        not_logging = {step: n for step, n in reads["lagged"].items() if step not in (1, 5, 10)}
        assert not_logging == {step: 1 for step in (3, 4, 7, 8, 9)}, reads
