"""``[profiling]``: a real 2-process run writes a Chrome/Perfetto trace per rank and the breakdown line."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import titan

TINY = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=32",
        "--training.local_batch_size=2", "--training.steps=4", "--metrics.log_freq=1")


def check_trace_event_json(path: Path) -> list[dict]:
    """The Chrome trace-event format Perfetto reads: an object with a traceEvents list whose
    complete events carry name, ph, ts (microseconds), dur, pid and tid."""
    data = json.loads(path.read_text())
    assert isinstance(data, dict) and isinstance(data["traceEvents"], list)
    events = data["traceEvents"]
    assert events, path
    for event in events:
        assert isinstance(event.get("ph"), str) and isinstance(event.get("name"), str), event
        if event["ph"] == "X":
            assert isinstance(event["ts"], (int, float)) and isinstance(event["dur"], (int, float)), event
            assert event["dur"] >= 0 and "pid" in event and "tid" in event, event
    return events


def test_two_ranks_each_write_their_trace_and_rank0_prints_the_breakdown(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run = titan(run_dir, *TINY, "--parallelism.dp_shard=2", "--profiling.enable=true", "--profiling.start_step=2",
                "--profiling.steps=2", nproc=2)
    assert run.code == 0, run.text
    for rank in (0, 1):
        folder = run_dir / "profile" / f"rank{rank}"
        events = check_trace_event_json(folder / "trace.json")
        names = {e["name"] for e in events if e["ph"] == "X"}
        # the trainer's phases, two profiled steps, and the FSDP2 collectives
        assert {"titan/forward", "titan/backward", "titan/optimizer", "titan/data"} <= names, sorted(names)[:50]
        assert sorted(n for n in names if n.startswith("titan/step#")) == ["titan/step#2", "titan/step#3"]
        assert any("c10d::" in n or "gloo" in n.lower() for n in names), sorted(names)[:80]
        breakdown = json.loads((folder / "breakdown.json").read_text())
        assert breakdown["steps"] == 2
        ms = breakdown["ms_per_step"]
        assert set(ms) == {"forward", "backward", "optimizer", "data", "communication"}
        assert ms["forward"] > 0 and ms["backward"] > 0 and ms["optimizer"] > 0 and ms["communication"] > 0, ms
    line = re.search(r"\[titan\] profile of steps 2-3: forward ([\d.]+)ms \| backward ([\d.]+)ms \| optimizer "
                     r"([\d.]+)ms \| data ([\d.]+)ms \| communication ([\d.]+)ms per step; traces in (\S+)", run.err)
    assert line is not None, run.err
    assert Path(line.group(6)) == run_dir / "profile"
    assert run.err.count("profile of steps") == 1  # rank 0 only


def test_memory_snapshot_says_cuda_only_and_the_folder_setting_is_used(tmp_path: Path) -> None:
    on = titan(tmp_path / "on", *TINY, "--profiling.enable=true", "--profiling.start_step=4",
               "--profiling.memory_snapshot=true", "--profiling.folder=traces")
    assert on.code == 0, on.text
    assert "profiling.memory_snapshot is CUDA-only" in on.err
    assert sorted(p.name for p in (tmp_path / "on" / "traces" / "rank0").iterdir()) == ["breakdown.json", "trace.json"]
    check_trace_event_json(tmp_path / "on" / "traces" / "rank0" / "trace.json")
