"""Hostile inputs, wave 8: a titan-generate prompt that is not UTF-8 (its bad bytes became replacement
characters and the command went on, exit 0), a layer named twice in the qwen3 spec's ``mlp_only_layers``
(accepted), and the lines of a resumed run's ``metrics.jsonl`` (read whole into memory, a line of gigabytes
included; a line nested past the JSON parser's depth ended the resume with a traceback).

Each case runs a CLI's ``main`` in this process under an alarm (one runs titan-generate in a process of its
own, to hand it real bytes on the command line). ``pytest -s`` prints the table of (case, exit code, message).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import hostile_harness as harness
import pytest

from titan_core.commands.generate import main as generate_main
from titan_core.runtime.run_files import SUPERSEDED_FILE, supersede_metrics

from conftest import CliResult

TABLE: list[tuple[str, int, str]] = []
table = harness.table_printer(TABLE, "input (wave 8)")
TRAIN = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=32",
         "--training.local_batch_size=2", "--metrics.report=false")
QWEN3_MOE = ("--spec", "qwen3", "--flavor", "debugmoe", "--training.steps=2", "--training.seq_len=32",
             "--training.local_batch_size=2", "--dry-run")
HANG_S = 60


no_hang = harness.alarm_guard(HANG_S)
tool = harness.tool


def record(case: str, result: CliResult) -> None:
    TABLE.append((case, result.code, harness.first_error_line(result)))


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 2 steps with a checkpoint at step 2 (built-in tokenizer), and its Hugging Face export (hf)."""
    from titan_core.commands.convert import main as convert_main
    from titan_core.commands.titan_train import main

    folder = tmp_path_factory.mktemp("wave8")
    with harness.signals_restored():
        assert main([*TRAIN, "--training.steps=2", "--checkpoint.enable=true", "--checkpoint.interval=2",
                     f"--job.run_dir={folder / 'run'}"]) == 0
    assert convert_main(["to-hf", str(folder / "run" / "checkpoints" / "step-000002"), str(folder / "hf")]) == 0
    return folder


# ---- titan-generate: a prompt that is not UTF-8 --------------------------------------------------------------

# Python holds a command line's byte that is not UTF-8 as U+DC80..U+DCFF (surrogateescape): "ab\udcffcd" is
# what `titan-generate RUN --prompt $'ab\xffcd'` hands main().
PROMPTS = [
    pytest.param("ab\udcffcd", "at byte offset 2 (counting from 0) it holds byte 0xff", id="0xff"),
    # é is 2 bytes and € 3: the offset counts bytes, not characters; a cut-off € (e2 82) is named by its first byte
    pytest.param("\u00e9\u20ac\udce2\udc82 x", "at byte offset 5 (counting from 0) it holds byte 0xe2",
                 id="cut-off character after multi-byte text"),
    pytest.param("caf\udce9", "at byte offset 3 (counting from 0) it holds byte 0xe9", id="Latin-1 e-acute"),
    # only main() can be handed this one (not a command line's byte): a lone surrogate from a JSON escape, say
    pytest.param("hi \ud800", "at byte offset 3 (counting from 0) it holds lone surrogate U+D800",
                 id="lone surrogate"),
]


@pytest.mark.parametrize("source", ["run", "hf"])
@pytest.mark.parametrize(("prompt", "fragment"), PROMPTS)
def test_a_prompt_that_is_not_utf8_is_refused(source: str, prompt: str, fragment: str, base: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before the model or its tokenizer (built-in for the run, tokenizer.json for the export) is read:
    both turned the bytes into U+FFFD and continued that text (exit 0)."""
    before = harness.snapshot(base / source)
    result = tool(capsys, generate_main, str(base / source), "--prompt", prompt, "--max-new-tokens", "2")
    record(f"generate {source}: --prompt {prompt!r} (replacement characters, exit 0)", result)
    harness.assert_one_clean_error(result, f"--prompt is not UTF-8 text: {fragment}, which UTF-8 does not allow")
    assert "give the prompt as UTF-8 (e.g. convert it with iconv -t UTF-8)" in result.text
    assert result.out == ""
    harness.assert_unchanged(before, base / source)


def test_a_non_utf8_command_line_prompt_is_one_line_in_its_own_process(base: Path) -> None:
    """The real bytes on a real command line: one error line and exit 2 (was: the continuation, exit 0)."""
    command = [os.fsencode(sys.executable), b"-m", b"titan_core.commands.generate", os.fsencode(base / "run"),
               b"--prompt", b"ab\xffcd", b"--max-new-tokens", b"2"]
    proc = subprocess.run(command, capture_output=True, timeout=HANG_S - 5, env={**os.environ, "OMP_NUM_THREADS": "1"})
    result = CliResult(proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"))
    record("generate (own process): --prompt $'ab\\xffcd' (exit 0)", result)
    harness.assert_one_clean_error(result, "titan-generate: error: --prompt is not UTF-8 text: at byte offset 2 "
                                           "(counting from 0) it holds byte 0xff")
    assert proc.stdout == b""


def test_a_utf8_prompt_beyond_ascii_still_generates(base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The guard of the check (passes before the fix too): text beyond ASCII that is UTF-8 is continued."""
    result = tool(capsys, generate_main, str(base / "run"), "--prompt", "caf\u00e9 \u20ac \U0001f600",
                  "--max-new-tokens", "2")
    assert result.code == 0, result.text
    assert result.out.startswith("caf\u00e9 \u20ac \U0001f600"), result.text


# ---- qwen3: a layer named twice in mlp_only_layers ---------------------------------------------------------


@pytest.mark.parametrize(("layers", "repeated"), [("[0,0]", "0 more than once ([0, 0])"),
                                                  ("[1,3,5,3]", "3 more than once ([1, 3, 5, 3])")])
def test_a_layer_named_twice_in_mlp_only_layers_is_refused(layers: str, repeated: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    harness.isolate(monkeypatch)
    result = harness.run_in_process(capsys, *QWEN3_MOE, f"--job.run_dir={tmp_path / 'run'}",
                                    f"--qwen3.mlp_only_layers={layers}")
    record(f"qwen3: mlp_only_layers={layers} (accepted)", result)
    harness.assert_one_clean_error(result, f"Qwen3Args: mlp_only_layers names layer {repeated}; list each layer once")
    assert not (tmp_path / "run").exists()


def test_a_hugging_face_config_naming_a_layer_twice_is_refused() -> None:
    """config.json's mlp_only_layers reaches the same check (titan-convert from-hf, titan-generate on a folder)."""
    import dataclasses

    from titan_core.errors import ConfigError
    from titan_qwen3.flavors import qwen3_flavors
    from titan_qwen3.hf_adapter import Qwen3StateDictAdapter

    adapter = Qwen3StateDictAdapter()
    config = adapter.hf_config(dataclasses.replace(qwen3_flavors["debugmoe"], vocab_size=256))
    config["mlp_only_layers"] = [2, 2]
    with pytest.raises(ConfigError, match=r"config\.json describes a shape the qwen3 model cannot take: Qwen3Args: "
                                          r"mlp_only_layers names layer 2 more than once \(\[2, 2\]\)"):
        adapter.model_args_from_hf(config)


# ---- resume: metrics.jsonl read a line at a time -------------------------------------------------------------


def records(*steps: int) -> bytes:
    return b"".join(json.dumps({"step": s, "loss": 2.0 + s / 10}).encode() + b"\n" for s in steps)


def test_superseding_streams_a_huge_line_and_keeps_it_byte_for_byte(tmp_path: Path) -> None:
    """A line of 48 MiB (past the 1 MiB cap: no record) is copied to the new metrics.jsonl in pieces; the file was
    read whole (the line's bytes and its text: over 100 MiB of memory for it)."""
    huge = b'{"note": "' + b"x" * (48 << 20) + b'"}\n'
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(records(1, 2) + huge + records(3, 4))
    tracemalloc.start()
    try:
        moved = supersede_metrics(path, start_step=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert moved == 2
    assert peak < 8 << 20, f"{peak / 2**20:.0f} MiB held to supersede a file with one line of 48 MiB"
    kept = path.read_bytes()
    assert hashlib.sha1(kept).digest() == hashlib.sha1(records(1, 2) + huge).digest()
    assert [json.loads(line) for line in (tmp_path / SUPERSEDED_FILE).read_text().splitlines()] == [
        {"step": s, "loss": 2.0 + s / 10, "superseded_by_run_from_step": 2} for s in (3, 4)]


def test_a_resume_keeps_lines_that_are_not_records_as_they_were(base: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Resuming from step 2 moves the records of steps 3 and 4 aside and keeps the rest. A line nested past the
    JSON parser's depth ended the resume with a RecursionError traceback; a long line that is not UTF-8 was
    rewritten with U+FFFD (and cut in two at its carriage return): now both are kept byte for byte."""
    harness.isolate(monkeypatch)
    run = tmp_path / "run"
    shutil.copytree(base / "run", run, symlinks=True)
    nested = b"[" * 200_000 + b"\n"
    long_line = b"\xff\xfe not UTF-8 \r" + b"y" * (2 << 20) + b"\n"
    original = (run / "metrics.jsonl").read_bytes()
    (run / "metrics.jsonl").write_bytes(original + long_line + nested + records(3, 4))
    checkpoints = harness.snapshot(run / "checkpoints")
    result = harness.run_in_process(capsys, *TRAIN, "--training.steps=3", "--checkpoint.enable=true",
                                    "--checkpoint.interval=100", f"--job.run_dir={run}")
    record("resume: metrics.jsonl with a 2 MiB non-UTF-8 line and a deeply nested one (traceback)", result)
    assert result.code == 0, result.text
    assert "Traceback" not in result.text
    assert "moved 2 records of steps after 2 from metrics.jsonl" in result.text
    data = (run / "metrics.jsonl").read_bytes()
    assert data.startswith(original + long_line + nested), "lines kept were changed"
    assert [json.loads(line)["step"] for line in data[len(original + long_line + nested):].splitlines()] == [3]
    assert [json.loads(line)["step"] for line in (run / SUPERSEDED_FILE).read_text().splitlines()] == [3, 4]
    harness.assert_unchanged(checkpoints, run / "checkpoints")


def test_superseding_keeps_and_moves_what_it_did_for_an_ordinary_file(tmp_path: Path) -> None:
    """The guard of the streaming (passes before the change too): blank lines dropped, a CRLF line and lines that
    are not records (text, a step of true or 1.0) kept, records past the step moved and marked."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(records(1) + b"\n   \n" + b'{"step": 2, "loss": 1.5}\r\n' + b"not json\n" + b'{"step": true}\n'
                     + b'{"step": 3.0}\n' + records(3) + b"[3]\n" + b'{"step": 4, "val_loss": 1.25}')
    assert supersede_metrics(path, start_step=2) == 2
    assert path.read_bytes() == (records(1) + b'{"step": 2, "loss": 1.5}\n' + b"not json\n" + b'{"step": true}\n'
                                 + b'{"step": 3.0}\n' + b"[3]\n")
    assert (tmp_path / SUPERSEDED_FILE).read_bytes() == (
        b'{"step": 3, "loss": 2.3, "superseded_by_run_from_step": 2}\n'
        b'{"step": 4, "val_loss": 1.25, "superseded_by_run_from_step": 2}\n')
    assert supersede_metrics(path, start_step=2) == 0  # nothing past step 2 is left: the file is not rewritten


class _FailingDisk:
    """metrics.jsonl as a disk that fails after its first line: a readline that raises EIO."""

    def __init__(self, first: bytes) -> None:
        self.lines = [first]

    def readline(self, limit: int = -1) -> bytes:
        if self.lines:
            return self.lines.pop()
        raise OSError(5, "Input/output error")

    def tell(self) -> int:
        return 0

    def __enter__(self) -> _FailingDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.lines.clear()


def test_a_read_error_on_metrics_is_named_as_one_not_as_a_write_error(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: "cannot write .../metrics.superseded.jsonl: [Errno 5] ..." for a failing read of metrics.jsonl.
    import titan_core.runtime.run_files as run_files

    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2}) + "\n")
    before = path.read_bytes()
    monkeypatch.setattr(run_files, "open_regular", lambda p: _FailingDisk(json.dumps({"step": 5}).encode() + b"\n"))
    with pytest.raises(run_files.TitanError) as caught:
        supersede_metrics(path, start_step=1)
    assert str(caught.value).startswith(f"cannot read {path} to resume: [Errno 5] Input/output error. Check the disk")
    assert path.read_bytes() == before  # nothing rewritten
