"""A checkpoint file swapped after it was verified is never read unverified.

The manifest's sizes and CRC-32s are checked first (each rank its share, so every rank
refuses a damaged checkpoint together); the files are then opened again to be read.
The hook here swaps a file in exactly that window (after ``verify_share`` passed,
before any tensor is read), by renaming a doctored copy over it as an attacker or a
second process would; the reader must notice, because the bytes it uses are the bytes
it checks (checkpoint/verified_read.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import run_main

SMALL = (
    "--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=32",
    "--training.local_batch_size=2", "--lr_scheduler.warmup_steps=1", "--checkpoint.enable=true",
    "--checkpoint.interval=2", "--checkpoint.keep_latest_k=0",
)
STEP = "checkpoints/step-000002"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import signal

    run = tmp_path_factory.mktemp("verified") / "run"
    from titan_core.commands.titan_train import main

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert main([*SMALL, "--training.steps=2", f"--job.run_dir={run}"]) == 0
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    return run


def swap_in(path: Path, change: Callable[[bytes], bytes]) -> None:
    """Replace ``path`` by a doctored copy (a new file renamed over it: what a racing writer does)."""
    tmp = path.with_name(path.name + ".swap")
    tmp.write_bytes(change(path.read_bytes()))
    os.replace(tmp, path)


def flip_middle(data: bytes) -> bytes:
    out = bytearray(data)
    out[len(out) // 2] ^= 0x40
    return bytes(out)


def forged_index(data: bytes) -> bytes:
    """The LR schedule moved from step 2 to 7: same length, still valid; only a check of these very bytes sees it."""
    import re

    forged, n = re.subn(rb'(last_epoch":)2([,}])', rb"\g<1>7\g<2>", data, count=1)
    assert n == 1 and len(forged) == len(data)
    return forged


def swap_after_verification(monkeypatch: pytest.MonkeyPatch, module: object, victim: Path,
                            change: Callable[[bytes], bytes]) -> list[str]:
    from titan_core.checkpoint import integrity

    real = integrity.verify_share
    swapped: list[str] = []

    def verify_then_swap(folder: Path, expected: dict, *, rank: int, world: int) -> str | None:
        verdict = real(folder, expected, rank=rank, world=world)
        assert verdict is None, verdict  # the checkpoint really was good when verified
        swap_in(victim, change)
        swapped.append(victim.name)
        return verdict

    monkeypatch.setattr(module, "verify_share", verify_then_swap)
    return swapped


@pytest.mark.parametrize("victim, change, fragment", [
    ("__0_0.distcp", flip_middle, "does not match its recorded CRC-32 checksum (the file is corrupt, or was replaced "
                                  "while it was read); nothing read from it was used"),
    ("tensor_index.json", forged_index, "its bytes differ from the size and CRC-32 its manifest records"),
])
def test_resume_refuses_a_file_swapped_between_verification_and_reading(
        victim: str, change: Callable[[bytes], bytes], fragment: str, saved: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    from titan_core.checkpoint import integrity

    run = tmp_path / "run"
    shutil.copytree(saved, run)
    assert change((run / STEP / victim).read_bytes()) != (run / STEP / victim).read_bytes()
    swapped = swap_after_verification(monkeypatch, integrity, run / STEP / victim, change)
    result = run_main(capsys, *SMALL, "--training.steps=4", f"--job.run_dir={run}")
    assert swapped == [victim]
    assert result.code == 2, result.text
    assert fragment in result.text, result.text
    assert "Traceback" not in result.text
    assert not (run / "checkpoints" / "step-000004").exists()  # nothing trained on the swapped bytes


def test_reading_tensors_outside_training_checks_the_bytes_it_returns(saved: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from titan_core.checkpoint import integrity
    from titan_core.checkpoint.reading import read_checkpoint_tensors
    from titan_core.errors import CheckpointError

    folder = tmp_path / "step"
    shutil.copytree(saved / STEP, folder)
    good = read_checkpoint_tensors(folder)  # the same folder reads fine without the swap
    assert "model.norm.weight" in good
    swap_after_verification(monkeypatch, integrity, folder / "__0_0.distcp", flip_middle)
    with pytest.raises(CheckpointError, match="does not match its recorded CRC-32 checksum"):
        read_checkpoint_tensors(folder)


def test_a_shard_replaced_by_a_symlink_after_verification_is_not_followed(
        saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from titan_core.checkpoint import integrity
    from titan_core.checkpoint.reading import read_checkpoint_tensors
    from titan_core.errors import CheckpointError

    folder = tmp_path / "step"
    shutil.copytree(saved / STEP, folder)
    outside = tmp_path / "outside.distcp"
    shutil.copy(folder / "__0_0.distcp", outside)  # identical bytes: only the link itself can be refused
    real = integrity.verify_share

    def verify_then_link(f: Path, expected: dict, *, rank: int, world: int) -> str | None:
        verdict = real(f, expected, rank=rank, world=world)
        (f / "__0_0.distcp").unlink()
        (f / "__0_0.distcp").symlink_to(outside)
        return verdict

    monkeypatch.setattr(integrity, "verify_share", verify_then_link)
    with pytest.raises(CheckpointError, match="cannot be opened"):
        read_checkpoint_tensors(folder)


def test_chunks_are_checked_against_one_pass_over_the_file(tmp_path: Path) -> None:
    """The unit: every wanted range is handed over once, in order, and the verdict covers the whole file."""
    import zlib

    from titan_core.checkpoint.verified_read import read_verified
    from titan_core.errors import CheckpointError

    data = bytes(range(256)) * 100
    (tmp_path / "f.bin").write_bytes(data)
    digest = (len(data), zlib.crc32(data))
    seen: list[tuple[int, int, bytes]] = []
    read_verified(tmp_path, "f.bin", digest, [(300, 10), (0, 4), (300, 10)],
                  lambda o, n, b: seen.append((o, n, bytes(b))))
    assert seen == [(0, 4, data[:4]), (300, 10, data[300:310])]
    with pytest.raises(CheckpointError, match="does not match its recorded CRC-32"):
        read_verified(tmp_path, "f.bin", (len(data), digest[1] ^ 1), [(0, 4)], lambda *a: None)
    with pytest.raises(CheckpointError, match="overlap"):
        read_verified(tmp_path, "f.bin", digest, [(0, 8), (4, 8)], lambda *a: None)
    with pytest.raises(CheckpointError, match="25599 bytes|was written with 25599"):
        read_verified(tmp_path, "f.bin", (len(data) - 1, 0), [(0, 4)], lambda *a: None)
