"""Hardening, fourth pass (issue 31, items 6 and 7): each class through the real command's ``main`` in this
process, on the 1-layer llama3 debug model: the exit code, the one message, no traceback, nothing saved lost.

Classes: the final loss a run reports (one noisy step, now a mean) and report charts with nothing to draw (an
empty frame, now one line); data on which document masking leaves no target (trained at loss 0); a shard
truncated or replaced while a run reads it (SIGBUS); a titan-data worker that dies (reported as "Connection
reset by peer" on "a file of the run") and a full disk in prepare (advised a flag titan-data does not have);
torchao's "Failed to load" warnings in float8/MX runs; titan-convert from-hf on a full disk (exit 0 and a half
folder).
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

TINY = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=32",
        "--training.local_batch_size=2", "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=1",
        "--metrics.report=false")


def train(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from titan_core.commands.titan_train import main

    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def prepare(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from titan_core.commands.data_prepare import main

    code = main(["prepare", *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def one_error(text: str, prog: str) -> str:
    errors = [line for line in text.splitlines() if f"{prog}: error:" in line or line.startswith("error:")]
    assert len(errors) == 1, text
    assert "Traceback" not in text, text
    return errors[0]


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small prepared shard set (200 short documents, shards of 512 tokens)."""
    from titan_core.commands.data_prepare import main

    folder = tmp_path_factory.mktemp("shards")
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} says alpha beta gamma delta"}) + "\n"
                              for i in range(200)))
    assert main(["prepare", str(corpus), "--tokenizer", "builtin", "--out", str(folder / "out"),
                 "--shard-tokens", "512", "--workers", "1"]) == 0
    return folder / "out"


def copy_shards(shard_set: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(shard_set, to)
    return to


# ---- item 7: a smoothed final loss; charts without data are one line ---------------------------------------


@pytest.mark.fast
def test_final_loss_is_the_mean_of_the_last_finite_losses() -> None:
    from titan_core.observability.final_loss import FINAL_LOSS_WINDOW, final_loss

    losses = [10.0] * 5 + [float(i % 2) for i in range(FINAL_LOSS_WINDOW - 1)] + [math.nan, 3.0]
    ending = final_loss(losses)
    assert ending is not None and ending.last == 3.0
    tail = [x for x in losses[-FINAL_LOSS_WINDOW:] if math.isfinite(x)]
    assert ending.count == len(tail) == FINAL_LOSS_WINDOW - 1 and ending.mean == pytest.approx(sum(tail) / len(tail))
    assert ending.describe() == f"{ending.mean:.4f} (mean of the last {ending.count} steps), last step 3.0000"
    assert final_loss([]) is None and final_loss([2.5]).describe() == "2.5000 (one step)"  # type: ignore[union-attr]


def test_a_run_ends_on_its_smoothed_loss_and_its_report_draws_no_empty_frame(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from titan_core.observability.report import write_run_report

    run = tmp_path / "run"
    code, text = train(capsys, *TINY, f"--job.run_dir={run}", "--training.steps=3")
    assert code == 0, text
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    mean = sum(losses) / 3
    assert f"final loss {mean:.4f} (mean of the last 3 steps), last step {losses[-1]:.4f}" in text, text

    page = write_run_report(run).html.read_text()
    assert "final loss (mean of the last 10 logged)" in page
    assert f"{mean:.4g} (last: {losses[-1]:.4g})" in page
    # Validation (off) and MFU (no peak on a CPU) have nothing to draw: one line each saying why, no frame.
    assert 'class="plot-area empty"' not in page
    assert re.search(r'data-metric="val_loss"><b>Validation loss</b>: not drawn, no validation: enable it with '
                     r'--validation.enable=true', page), page
    assert 'data-metric="mfu"><b>MFU (%)</b>: not drawn, no MFU' in page
    assert page.count('<svg class="chart"') == 5


# ---- item 6: document masking on data with no target ----------------------------------------------------------


def eos_only(shard_set: Path, to: Path) -> Path:
    """``shard_set`` with every token replaced by the builtin tokenizer's EOS (index hashes updated: a valid set)."""
    import numpy as np

    from titan_core.data.shard_format import VERIFIED_NAME, file_sha256
    from titan_core.plan.tokenizer import build_tokenizer

    folder = copy_shards(shard_set, to)
    index = json.loads((folder / "index.json").read_text())
    eos = build_tokenizer("builtin").eos_id
    for entry in index["shards"]:
        path = folder / entry["file"]
        np.full(entry["tokens"], eos, dtype=index["dtype"]).tofile(path)
        entry["sha256"] = file_sha256(path)
    (folder / "index.json").write_text(json.dumps(index))
    (folder / VERIFIED_NAME).unlink(missing_ok=True)
    return folder


@pytest.mark.parametrize("how", ["data.source", "mixture source"])
def test_document_masking_on_data_without_a_target_is_refused_before_training(
        how: str, shard_set: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = eos_only(shard_set, tmp_path / "eos")
    data = (f"--data.source=tokens:{bad}",) if how == "data.source" else \
        (f"--data.mix.text.source=tokens:{shard_set}", "--data.mix.text.weight=0.5",
         f"--data.mix.ends.source=tokens:{bad}", "--data.mix.ends.weight=0.5")
    run = tmp_path / "run"
    code, text = train(capsys, *TINY, *data, "--data.document_masking=true", "--training.steps=1",
                       f"--job.run_dir={run}")
    assert code == 2, text
    line = one_error(text, "titan-train")
    named = f'data.source "tokens:{bad}"' if how == "data.source" else f'data.mix.ends.source "tokens:{bad}"'
    assert f"data.document_masking=true leaves no token with a target in {named} (train split)" in line, line
    assert "--data.document_masking=false" in line
    assert not (run / "metrics.jsonl").exists()  # refused before the first step

    code, text = train(capsys, *TINY, f"--data.source=tokens:{shard_set}", "--data.document_masking=true",
                       "--training.steps=1", f"--job.run_dir={tmp_path / 'fine'}")
    assert code == 0, text  # ordinary data passes the check


# ---- item 6: a shard truncated or replaced while the run reads it -------------------------------------------


@pytest.mark.parametrize("change", ["truncated", "replaced by a shorter file"])
def test_a_shard_changed_under_a_run_is_one_error_naming_it_and_the_checkpoint_is_kept(
        change: str, shard_set: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards were memory-mapped: a shorter file under a mapping killed the run with SIGBUS. Now a read comes back
    short (same file) or the reopened file is another one (MAX_OPEN_SHARDS=1 reopens a shard at every switch)."""
    import numpy as np

    from titan_core.data import shards

    folder = copy_shards(shard_set, tmp_path / "shards")
    real_read = shards.ShardSet.read
    run = tmp_path / "run"
    saved = run / "checkpoints" / "step-000001" / "titan_checkpoint.json"
    victim: list[Path] = []

    def read_then_change(self: shards.ShardSet, start: int, length: int, out: object) -> None:
        if saved.is_file() and not victim:  # once step 1 is saved: the shard this read is about to use
            victim.append(self.shards[int(np.searchsorted(self.starts, start, side="right")) - 1].path)
            if change == "truncated":
                os.truncate(victim[0], 10)
            else:
                (folder / "new.bin").write_bytes(b"\0" * 10)
                os.replace(folder / "new.bin", victim[0])
        real_read(self, start, length, out)  # type: ignore[arg-type]

    monkeypatch.setattr(shards.ShardSet, "read", read_then_change)
    monkeypatch.setattr(shards, "MAX_OPEN_SHARDS", 1)
    code, text = train(capsys, *TINY, f"--data.source=tokens:{folder}", "--training.steps=200",
                       "--checkpoint.enable=true", "--checkpoint.interval=1", f"--job.run_dir={run}")
    assert code == 2, text
    line = one_error(text, "titan-train")
    said = f"{victim[0].name} was truncated to 10 bytes (the index records" if change == "truncated" else \
        f"{victim[0].name} was replaced by another file"
    assert f"shard set {folder}: {said}" in line and "while this run read it" in line, line
    assert "resume from the last checkpoint" in line
    kept = sorted((run / "checkpoints").glob("step-*/titan_checkpoint.json"))
    assert kept, text  # nothing saved is lost: the newest checkpoints stay whole


# ---- item 6: a titan-data worker that dies; a full disk in prepare ---------------------------------------------


@pytest.mark.parametrize("death, said", [("SIGKILL", "was killed by SIGKILL (the kernel's out-of-memory killer, or kill -9)"),
                                         ("exit 3", "exited with code 3")])
def test_a_dead_prepare_worker_is_named_with_how_it_died_and_its_input(
        death: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """It was "Connection reset by peer" on "a file of the run". The workers are forked: the patched encoder is
    theirs, and each one ends the real process (no exception crosses the pipe)."""
    from titan_core.data.prepare import workers

    def die(*_: object) -> None:
        if death == "SIGKILL":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(3)

    monkeypatch.setattr(workers, "encode_documents", die)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(50)))
    out = tmp_path / "out"
    code, text = prepare(capsys, str(corpus), "--tokenizer", "builtin", "--out", str(out), "--workers", "2")
    assert code == 2, text
    line = one_error(text, "titan-data")
    assert re.search(rf"titan-data worker 1 of 2 \(pid \d+\) {re.escape(said)} while tokenizing "
                     rf"{re.escape(str(corpus))} \(bytes 0\.\.{corpus.stat().st_size}, task 0\)", line), line
    assert f"the finished shards in {out} are kept" in line and "Connection reset" not in line


@pytest.mark.parametrize("named", [True, False], ids=["the file named", "no file named"])
def test_a_full_disk_in_prepare_advises_its_own_out_flag(
        named: bool, shard_set: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """It advised --job.run_dir (a titan-train setting, remembered from an earlier run in the same process)."""
    from titan_core.data.prepare import writer

    code, text = train(capsys, *TINY, f"--job.run_dir={tmp_path / 'run'}", "--training.steps=1")
    assert code == 0, text  # a training run in this process first: its settings must not leak into titan-data

    def full(f: object, tmp: Path, path: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", *([str(path)] if named else []))

    monkeypatch.setattr(writer, "publish", full)
    out = tmp_path / "out"
    code, text = prepare(capsys, "builtin", "--tokenizer", "builtin", "--out", str(out), "--shard-tokens", "512",
                         "--workers", "1")
    assert code == 2, text
    line = one_error(text, "titan-data")
    where = f"{out}/shard-00000.bin" if named else f"a file in {out}"
    assert f"disk full while writing {where}: free space on that filesystem or point --out at another one" in line
    assert f"The finished shards in {out} are kept" in line and "job.run_dir" not in line
    assert "Checkpoints" not in line, line


# ---- item 6: torchao's "Failed to load" warnings in float8/MX runs ----------------------------------------------


def test_float8_and_mx_runs_show_no_torchao_load_warnings_and_still_say_they_are_emulated(tmp_path: Path) -> None:
    """One fresh process (torchao warns on its first import only): the real command, as a user runs it."""
    from conftest import run_cli

    result = run_cli("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--converters", "float8,mx",
                     f"--job.run_dir={tmp_path / 'run'}", "--dry-run", cwd=tmp_path)
    assert result.code == 0, result.text
    assert "Failed to load" not in result.text and "register_constant()" not in result.text, result.text
    assert "float8: float8 matmuls are emulated in float32 on cpu" in result.out + result.err
    assert "mx: MXFP8 matmuls are emulated" in result.text


@pytest.mark.fast
def test_only_torchao_extension_load_warnings_are_dropped_and_a_gpu_run_is_told_once(
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from titan_core.runtime import library_noise

    library_noise.quiet_torchao_extension_loads()
    library_noise.quiet_torchao_extension_loads()  # idempotent: one filter
    torchao = logging.getLogger("torchao")
    assert torchao.filters.count(library_noise._FILTER) == 1
    before = list(library_noise._failed)
    torchao.warning("Failed to load /site/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: Could not load this library")
    torchao.warning("some other torchao warning")
    assert "Failed to load" not in capsys.readouterr().err
    assert [r.getMessage() for r in caplog.records if r.name == "torchao"] == ["some other torchao warning"]
    assert library_noise._failed[len(before):] == ["_C_mxfp8.cpython-310-x86_64-linux-gnu.so"]
    note = library_noise.kernel_load_note()
    assert note is not None and "_C_mxfp8.cpython-310-x86_64-linux-gnu.so" in note and "fused kernels" in note
    library_noise._failed[:] = before


# ---- item 6: titan-convert onto a full disk -----------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-step run with a checkpoint and its Hugging Face export (the inputs of both conversions)."""
    from titan_core.commands.titan_train import main

    run = tmp_path_factory.mktemp("export") / "run"
    assert main([*TINY, f"--job.run_dir={run}", "--training.steps=1", "--checkpoint.enable=true",
                 "--checkpoint.export_at_end=true", "--checkpoint.export_format=hf"]) == 0
    return run


def _enospc(path: object) -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", str(path))


def full_tensor_file(monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_core.checkpoint.storage import IndexedWriter

    def write_data(self: IndexedWriter, *_: object, **__: object) -> None:
        raise _enospc(self.path)

    monkeypatch.setattr(IndexedWriter, "write_data", write_data)


def full_identity_file(monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_core.checkpoint import manager

    def write_record(folder: Path, *_: object) -> None:
        raise _enospc(folder / "titan_checkpoint.json")

    monkeypatch.setattr(manager, "write_record", write_record)


def full_files_list(monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_core.commands import convert

    def publish(partial: Path, final: Path) -> None:
        raise _enospc(partial / ".titan-files.json")

    monkeypatch.setattr(convert, "publish", publish)


def full_safetensors(monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_core.hf import export

    def save_file(_: object, filename: str, **__: object) -> None:
        raise _enospc(filename)

    monkeypatch.setattr(export, "save_file", save_file)


@pytest.mark.parametrize("command, fill", [
    ("from-hf", full_tensor_file), ("from-hf", full_identity_file), ("from-hf", full_files_list),
    ("to-hf", full_safetensors)], ids=["from-hf tensors", "from-hf identity file", "from-hf files list", "to-hf"])
def test_titan_convert_onto_a_full_disk_exits_2_and_leaves_no_folder(
        command: str, fill: Callable[[pytest.MonkeyPatch], None], exported: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """It exited 0 leaving a half folder, or advised --checkpoint.folder / job.run_dir (titan-train settings)."""
    from titan_core.commands.convert import main

    source = exported / "export" / "hf" if command == "from-hf" else exported / "checkpoints" / "step-000001"
    dest = tmp_path / "dest"
    dest.mkdir()
    fill(monkeypatch)
    code = main([command, str(source), str(dest / "out")])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == 2, text
    line = one_error(text, "titan-convert")
    assert "No space left on device" in line or "disk full" in line, line
    assert f"Nothing was written to {dest / 'out'}" in line and "OUT" in line, line
    assert "checkpoint.folder" not in line and "job.run_dir" not in line, line
    assert list(dest.iterdir()) == []  # neither OUT nor its unfinished copy beside it
