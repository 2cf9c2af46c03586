"""``titan-train --nproc-per-node 2``: a user error is printed once, not once per rank.

Real 2-process runs through the launcher (gloo). Each asserts the exit code, how many
times each message appears, which ranks are named, and that there is no traceback
(except with ``--traceback``, where every worker still shows its own). Plain torchrun
keeps one message per rank, each with its ``[rankN]`` prefix.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from conftest import REPO, run_cli, run_main

TINY = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=32",
        "--training.local_batch_size=2", "--training.steps=2", "--parallelism.dp_shard=2")
CONFIGS = '''
import os


def per_rank():
    """Each worker fails with a message of its own (the launcher itself has no RANK and passes)."""
    if "RANK" in os.environ:
        raise ValueError(f"bad setting on rank {os.environ['RANK']}")
    return {}


def only_rank1():
    if os.environ.get("RANK") == "1":
        raise ValueError("only rank 1 sees this")
    return {}
'''


def errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if "error:" in line]


def launch(tmp_path: Path, *args: str) -> tuple[int, str, float]:
    """The launcher's temporary folders go to ``tmp_path / "tmp"`` (TMPDIR): only this run's land there,
    whatever the tests running beside it launch."""
    (tmp_path / "rank_configs.py").write_text(CONFIGS)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    start = time.monotonic()
    result = run_cli("--nproc-per-node", "2", *TINY, f"--job.run_dir={tmp_path / 'run'}", *args,
                     env={"PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)]), "TMPDIR": str(tmp_path / "tmp")},
                     timeout=300)
    return result.code, result.text, time.monotonic() - start


def test_an_error_every_rank_hits_is_printed_once(tmp_path: Path) -> None:
    code, text, _ = launch(tmp_path, f"--data.source={tmp_path}/missing.txt")
    assert code == 2, text
    assert errors(text) == [f'titan-train: error: data.source "{tmp_path}/missing.txt" does not exist; give an '
                            f'existing .txt/.jsonl/.json/.parquet file or folder, "builtin", or "hf:<name>".'], text
    assert text.count("(run with --traceback to see where it happened)") == 1, text
    assert "Traceback" not in text
    left = list((tmp_path / "tmp").glob("titan-errors-*"))
    assert not left, left  # the launcher removed its private inbox


def test_different_messages_name_their_ranks_and_traceback_still_shows(tmp_path: Path) -> None:
    code, text, _ = launch(tmp_path, "--config", "rank_configs:per_rank", "--traceback")
    assert code == 2, text
    lines = errors(text)
    mine = [line for line in lines if line.startswith("titan-train: error: rank")]
    assert [line.split(" --config")[0] for line in mine] == ["titan-train: error: rank 0:", "titan-train: error: rank 1:"]
    assert "bad setting on rank 0" in mine[0] and "bad setting on rank 1" in mine[1], text
    assert len(lines) == 2, text
    # --traceback: each worker shows its own (the config function's ValueError and the ConfigError it became)
    assert text.count("ValueError: bad setting on rank 0\n") == 1 and text.count("ValueError: bad setting on rank 1\n") == 1
    assert text.count("Traceback (most recent call last)") >= 2, text
    assert "(run with --traceback" not in text


def test_a_message_only_one_rank_hits_is_printed_naming_it(tmp_path: Path) -> None:
    code, text, took = launch(tmp_path, "--config", "rank_configs:only_rank1")
    assert code == 2, text
    assert errors(text) == ["titan-train: error: rank 1: --config rank_configs:only_rank1: the config function raised "
                            "ValueError: only rank 1 sees this. Fix the function (--traceback shows where)."], text
    assert "Traceback" not in text
    assert took < 60, took  # rank 0 (waiting for its peer) was stopped, not left to its rendezvous timeout


def test_a_forged_inbox_variable_outside_the_launcher_never_swallows_the_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir(mode=0o700)
    monkeypatch.setenv("TITAN_LAUNCHER_ERRORS", str(inbox))
    monkeypatch.setenv("RANK", "0")
    for pid in ("12345", str(os.getpid())):  # not this process's parent: no launcher is listening
        monkeypatch.setenv("TITAN_LAUNCHER_PID", pid)
        result = run_main(capsys, "--training.stepz=1")
        assert result.code == 2
        assert 'unknown key "training.stepz"' in result.err, result.text
    assert list(inbox.iterdir()) == []
    assert stat.S_IMODE(inbox.stat().st_mode) == 0o700


def test_the_inbox_reports_each_message_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from titan_core.runtime.worker_errors import ErrorInbox, hand_to_launcher

    inbox = ErrorInbox()
    try:
        assert stat.S_IMODE(inbox.folder.stat().st_mode) == 0o700
        monkeypatch.setenv("TITAN_LAUNCHER_PID", str(os.getppid()))  # as a worker sees its launcher
        for k, v in inbox.env().items():
            monkeypatch.setenv(k, v)
        for rank, message in ((0, "same"), (1, "same"), (2, "other"), (3, "same")):
            monkeypatch.setenv("RANK", str(rank))
            assert hand_to_launcher(message, hint=True)
        (inbox.folder / "rank9.json").write_text("not json")  # garbage is skipped, never fatal
        assert inbox.report(4) == 2
        assert capsys.readouterr().err.splitlines() == [
            "titan-train: error: ranks 0,1,3: same", "titan-train: error: rank 2: other",
            "(run with --traceback to see where it happened)"]
    finally:
        inbox.close()
    assert not inbox.folder.exists()


def test_plain_torchrun_still_prints_each_ranks_message(tmp_path: Path) -> None:
    from conftest import torchrun

    run = torchrun(tmp_path / "run", *TINY, f"--data.source={tmp_path}/missing.txt", timeout=300)
    assert run.code != 0
    # Each worker prints its own message (rank-prefixed: nothing is handed to a launcher that is not there).
    # torchrun's agent stops the group once one worker has failed, so on a loaded machine the slower rank
    # may be stopped before it gets to print: one or both ranks, never none, never unprefixed.
    messages = [line for line in errors(run.text) if "does not exist" in line]
    prefixes = sorted(line.split("]")[0] for line in messages)
    assert prefixes in (["[rank0", "[rank1"], ["[rank0"], ["[rank1"]), run.text
    # Each message is a whole line of its own: one rank's line is never spliced into another's.
    assert all(line.startswith("[rank") and line.count("[rank") == 1 for line in messages), run.text
