"""Hostile inputs, wave 7: a named pipe (FIFO) or a folder where a tool reads or probes a file of a run,
a shard set or a prepare (every one of these hung for good before, titan-train even past SIGTERM), very
long lines in a report's metrics, the same run folder given twice to titan-report, and sampling
temperatures so small that the probabilities became NaN (a traceback from torch.multinomial).

Each case runs a CLI's ``main`` in this process under an alarm: a hang fails the test instead of holding
the suite. ``pytest -s`` prints the table of (case, exit code, message).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import hostile_harness as harness
import pytest
import torch
from test_hostile_data_wave6 import notes

from titan_core.commands.data_prepare import main as data_main
from titan_core.commands.generate import main as generate_main
from titan_core.commands.report import main as report_main
from titan_core.errors import NonFiniteError
from titan_core.models.sampling import Sampling, _pick
from titan_core.runtime.regular_files import bounded_lines

from conftest import CliResult

TABLE: list[tuple[str, int, str]] = []
table = harness.table_printer(TABLE, "input (wave 7)")
TRAIN = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=32",
         "--training.local_batch_size=2", "--metrics.report=false")
HANG_S = 60


no_hang = harness.alarm_guard(HANG_S)
tool = harness.tool


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 2 steps with a checkpoint at step 2, and a prepared shard set with its source."""
    from titan_core.commands.titan_train import main

    folder = tmp_path_factory.mktemp("wave7")
    (folder / "notes.jsonl").write_text(notes(), encoding="utf-8")
    assert data_main(["prepare", str(folder / "notes.jsonl"), "--tokenizer", "builtin", "--out",
                      str(folder / "shards"), "--shard-tokens", "2000", "--quiet"]) == 0
    with harness.signals_restored():
        assert main([*TRAIN, "--training.steps=2", "--checkpoint.enable=true", "--checkpoint.interval=2",
                     f"--job.run_dir={folder / 'run'}"]) == 0
    return folder


def copy_of(base: Path, name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(base / name, target, symlinks=True)
    return target


def fifo_at(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def link_to_fifo(path: Path) -> None:
    fifo_at(path.with_name("pipe"))
    path.unlink(missing_ok=True)
    path.symlink_to("pipe")


def folder_at(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.mkdir()


def record(case: str, result: CliResult) -> None:
    TABLE.append((case, result.code, harness.first_error_line(result)))


# ---- titan-train: the run folder's files, a shard set's files ---------------------------------------------


@dataclass(frozen=True)
class RunFileCase:
    id: str
    name: str  # the run folder's file replaced
    make: Callable[[Path], None]
    fragment: str


RUN_FILE_CASES = [
    RunFileCase("resume: config.toml a FIFO (hung in the writable probe)", "config.toml", fifo_at,
                "config.toml: it is a named pipe (FIFO), not a regular file"),
    RunFileCase("resume: metrics.jsonl a FIFO (hung in the writable probe)", "metrics.jsonl", fifo_at,
                "metrics.jsonl: it is a named pipe (FIFO), not a regular file"),
    RunFileCase("resume: metrics.jsonl a link to a FIFO (hung; a link was called dangling)", "metrics.jsonl",
                link_to_fifo,
                "metrics.jsonl: it is a named pipe (FIFO), not a regular file"),
]


@pytest.mark.parametrize("case", RUN_FILE_CASES, ids=[c.id for c in RUN_FILE_CASES])
def test_a_run_folder_file_that_is_a_fifo_is_one_clean_error(case: RunFileCase, base: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    harness.isolate(monkeypatch)
    run = copy_of(base, "run", tmp_path)
    case.make(run / case.name)
    before = harness.snapshot(run)
    result = harness.run_in_process(capsys, *TRAIN, "--training.steps=3", "--checkpoint.enable=true", f"--job.run_dir={run}")
    record(case.id, result)
    harness.assert_one_clean_error(result, case.fragment)
    harness.assert_unchanged(before, run)
    assert (run / case.name).is_fifo()


def test_a_fifo_as_the_shard_set_s_mtime_cache_is_ignored(base: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """.verified.json only spares the hashes: a FIFO there (read, it hung the run past SIGTERM) is no cache."""
    harness.isolate(monkeypatch)
    shards = copy_of(base, "shards", tmp_path)
    fifo_at(shards / ".verified.json")
    result = harness.run_in_process(capsys, *TRAIN, "--training.steps=1", f"--data.source=tokens:{shards}",
                            f"--job.run_dir={tmp_path / 'run'}")
    record("shard set: .verified.json a FIFO (hung past SIGTERM)", result)
    assert result.code == 0, result.text
    assert "Traceback" not in result.text


@pytest.mark.parametrize("make", [fifo_at, folder_at], ids=["fifo", "folder"])
def test_an_index_json_that_is_not_a_file_is_named_as_such(make: Callable[[Path], None], base: Path,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """It was called missing ("has no index.json"), which points at the wrong fix."""
    harness.isolate(monkeypatch)
    shards = copy_of(base, "shards", tmp_path)
    make(shards / "index.json")
    before = harness.snapshot(shards)
    result = harness.run_in_process(capsys, *TRAIN, "--training.steps=1", f"--data.source=tokens:{shards}",
                            f"--job.run_dir={tmp_path / 'run'}")
    record(f"shard set: index.json a {make.__name__.removesuffix('_at')}", result)
    harness.assert_one_clean_error(result, "index.json is a ")
    assert "not a regular file" in result.text
    harness.assert_unchanged(before, shards)


# ---- titan-data prepare: the records of an earlier prepare in --out -------------------------------------


@pytest.mark.parametrize("name", ["prepare.json", "index.json"])
def test_prepare_refuses_a_fifo_among_an_earlier_prepare_s_records(name: str, base: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    fifo_at(out / name)
    result = tool(capsys, data_main, "prepare", str(base / "notes.jsonl"), "--tokenizer", "builtin", "--out",
                  str(out), "--quiet")
    record(f"prepare: --out holds a FIFO {name} (hung)", result)
    harness.assert_one_clean_error(result, f"its {name} cannot be read")
    assert "named pipe (FIFO), not a regular file" in result.text
    assert sorted(p.name for p in out.iterdir()) == [name]


# ---- titan-report -----------------------------------------------------------------------------------------


def test_report_skips_a_fifo_as_metrics_superseded(base: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_of(base, "run", tmp_path)
    fifo_at(run / "metrics.superseded.jsonl")
    result = tool(capsys, report_main, str(run))
    record("report: metrics.superseded.jsonl a FIFO (hung)", result)
    assert result.code == 0, result.text
    assert (run / "report.html").is_file()


@pytest.mark.parametrize("make", [fifo_at, folder_at], ids=["fifo", "folder"])
def test_report_names_a_metrics_jsonl_that_is_not_a_file(make: Callable[[Path], None], base: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_of(base, "run", tmp_path)
    make(run / "metrics.jsonl")
    before = harness.snapshot(run)
    result = tool(capsys, report_main, str(run))
    record(f"report: metrics.jsonl a {make.__name__.removesuffix('_at')} (called missing)", result)
    harness.assert_one_clean_error(result, "metrics.jsonl is a ")
    assert "not the file of records a run writes" in result.text
    harness.assert_unchanged(before, run)


def test_report_skips_and_counts_a_line_longer_than_any_record(base: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_of(base, "run", tmp_path)
    with (run / "metrics.jsonl").open("ab") as f:
        f.write(b"7" * (3 << 20) + b"\n" + json.dumps({"step": 9, "loss": 1.5}).encode() + b"\n")
    result = tool(capsys, report_main, str(run))
    record("report: a 3 MiB line in metrics.jsonl", result)
    assert result.code == 0, result.text
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "1 unreadable lines of metrics.jsonl skipped" in page


def test_bounded_lines_cuts_only_the_long_line() -> None:
    import io

    lines = list(bounded_lines(io.BytesIO(b"ab\n" + b"x" * 25 + b"\ncd\n" + b"y" * 7), limit=8))
    assert lines == [b"ab\n", None, b"cd\n", b"y" * 7]


@pytest.mark.parametrize("second", ["{run}", "{run}/", "{run}/../run", "{link}"])
def test_report_refuses_the_same_run_twice(second: str, base: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_of(base, "run", tmp_path)
    (tmp_path / "link").symlink_to(run)
    before = harness.snapshot(run)
    result = tool(capsys, report_main, str(run), second.format(run=run, link=tmp_path / "link"), "--out",
                  str(tmp_path / "both.html"))
    record(f"report: one run given twice ({second}) (drawn twice, exit 0)", result)
    harness.assert_one_clean_error(result, "a second time")
    assert "give each run folder once" in result.text
    assert not (tmp_path / "both.html").exists()
    harness.assert_unchanged(before, run)


# ---- titan-generate ---------------------------------------------------------------------------------------


def test_generate_names_a_run_config_that_is_a_fifo(base: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """It was taken as absent, and the flavor's default shapes then failed to match the checkpoint."""
    run = copy_of(base, "run", tmp_path)
    fifo_at(run / "config.toml")
    result = tool(capsys, generate_main, str(run), "--prompt", "hi", "--max-new-tokens", "1")
    record("generate: the run's config.toml a FIFO (blamed the flavor)", result)
    harness.assert_one_clean_error(result, "config.toml is a named pipe (FIFO), not the run's config file")


@pytest.mark.parametrize("temperature", [1e-40, 1e-320, 5e-324])
def test_a_tiny_temperature_samples_the_most_likely_token(temperature: float) -> None:
    """logits / 1e-40 overflowed to inf, softmax gave NaN, torch.multinomial raised (a traceback)."""
    logits = torch.tensor([0.5, 3.0, -2.0, 2.9])
    generator = torch.Generator().manual_seed(0)
    for top_k in (None, 2):
        assert _pick(logits, Sampling(temperature=temperature, top_k=top_k), generator) == 1


def test_ordinary_sampling_is_unchanged_by_the_shift() -> None:
    logits = torch.randn(64, generator=torch.Generator().manual_seed(3))
    picks = [_pick(logits, Sampling(temperature=0.8, top_k=10), torch.Generator().manual_seed(s)) for s in range(20)]
    expected = []
    for s in range(20):
        scaled = logits / 0.8
        kth = torch.topk(scaled, 10).values[-1]
        probs = torch.softmax(scaled.masked_fill(scaled < kth, -math.inf), dim=-1)
        expected.append(int(torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(s))))
    assert picks == expected


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_logits_are_a_titan_error(bad: float) -> None:
    logits = torch.tensor([0.5, bad, 1.0])
    for temperature in (0.0, 0.7):
        with pytest.raises(NonFiniteError, match="holds NaN or inf"):
            _pick(logits, Sampling(temperature=temperature), torch.Generator().manual_seed(0))


def test_generate_with_a_tiny_temperature_exits_0(base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = tool(capsys, generate_main, str(base / "run"), "--prompt", "hi", "--max-new-tokens", "2",
                  "--temperature", "1e-320")
    record("generate: --temperature 1e-320 (traceback)", result)
    assert result.code == 0, result.text
    assert "Traceback" not in result.text


# ---- fault tolerance: a group that ends unfinished after another finished the run -----------------------


def test_a_group_ending_unfinished_after_the_run_finished_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    """Exit 6 (gave up) came with no line at all (seen with --fault_tolerance.quorum_timeout_s=0.001: one group
    finished, the other ended with an error the supervisor did not restart)."""
    import sys

    from titan_core.config.job import JobConfig
    from titan_core.fault_tolerance import supervisor

    harness.isolate(monkeypatch)
    stand_ins = {0: "print('finished', flush=True)", 1: "import sys, time; time.sleep(1.5); sys.exit(1)"}
    monkeypatch.setattr(supervisor.Supervisor, "child_command",
                        lambda self, replica_id: [sys.executable, "-c", stand_ins[replica_id]])
    config = JobConfig.model_validate({"job": {"run_dir": str(tmp_path / "run")}, "fault_tolerance": {
        "local_replicas": 2, "quorum_timeout_s": 5, "max_restarts": 0}})
    with harness.signals_restored():
        code = supervisor.supervise(config, [])
    captured = capfd.readouterr()
    result = CliResult(code, captured.out, captured.err)
    record("ft: a group ends unfinished after the run finished (exit 6, no line)", result)
    assert code == 6, result.text
    assert "replica 1 (exit 1) ended without finishing it" in result.err, result.text
    assert "Traceback" not in result.text


def test_an_ft_event_is_not_written_into_a_fifo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The supervisor appends to ft_events.jsonl: a FIFO there held it in open() for good; now one warning."""
    from titan_core.runtime.ft_events import append_event, read_events

    fifo_at(tmp_path / "ft_events.jsonl")
    append_event(tmp_path, "start", groups=2)
    assert "could not record 'start'" in capsys.readouterr().err
    assert read_events(tmp_path) == ([], 0)
