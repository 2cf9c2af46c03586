"""``--metrics.tensorboard=true``: event files with the scalars of metrics.jsonl, read back with EventAccumulator."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import REPO, assert_user_error, run_cli, titan

TINY = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=32",
        "--training.local_batch_size=2", "--training.steps=6", "--metrics.log_freq=2")


def test_event_files_hold_the_same_scalars_as_metrics_jsonl(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    run = titan(run_dir, *TINY, "--metrics.tensorboard=true", "--validation.enable=true", "--validation.freq=3",
                "--validation.steps=1", "--parallelism.dp_shard=2", nproc=2)
    assert run.code == 0, run.text
    folder = run_dir / "tensorboard"
    assert len(list(folder.glob("events.out.tfevents.*"))) == 1  # rank 0 only
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    expected: dict[str, dict[int, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key, value in record.items():
            if key != "step":
                expected.setdefault(key, {})[int(record["step"])] = value
    assert {"loss", "val_loss", "lr", "grad_norm", "tokens_per_s"} <= set(expected)
    assert sorted(events.Tags()["scalars"]) == sorted(expected)
    for tag, by_step in expected.items():
        got = {e.step: e.value for e in events.Scalars(tag)}
        assert sorted(got) == sorted(by_step), tag
        for step, value in by_step.items():
            assert got[step] == pytest.approx(value, rel=1e-6, abs=1e-7), (tag, step)  # float32 in event files
    assert sorted(expected["loss"]) == [1, 2, 4, 6] and sorted(expected["val_loss"]) == [3, 6]
    assert not (run_dir / "profile").exists()  # profiling is off by default and writes nothing


def test_a_missing_tensorboard_package_is_one_message(tmp_path: Path) -> None:
    (tmp_path / "hide_tensorboard.py").write_text("import sys\nsys.modules['tensorboard'] = None  # find_spec: missing\n")
    result = run_cli(*TINY, "--metrics.tensorboard=true", "--import", "hide_tensorboard",
                     f"--job.run_dir={tmp_path / 'run'}", env={"PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])})
    assert_user_error(result, "metrics.tensorboard=true needs the tensorboard package",
                      "pip install 'titan-core[tensorboard]'")
    assert not (tmp_path / "run" / "tensorboard").exists()
