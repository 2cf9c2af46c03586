"""Real EACCES / EROFS / ENOSPC on the run's own files: one line naming the file and the problem, exit 2.

The tests run as root, and root ignores file modes, so each run is started without the
capabilities that let root do so (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER are
dropped from its bounding set before exec): a 0o444 file or 0o555 folder then refuses it
exactly as it refuses an ordinary user. (Run as an ordinary user, the modes apply anyway.)
Read-only and full filesystems are real mounts in a private mount namespace of the run
(``unshare -m``: nothing is mounted outside it); those cases are skipped, saying why,
where the machine does not allow that.

Each case copies a finished 4-step run (checkpoints at steps 2 and 4) and asserts: exit
code 2, one error line naming the file and the problem, no traceback, and every file that
existed before is byte-identical afterwards.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO

SMALL = (
    "--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=32",
    "--training.local_batch_size=2", "--lr_scheduler.warmup_steps=1", "--checkpoint.enable=true",
    "--checkpoint.interval=2", "--checkpoint.keep_latest_k=0",
)
_PR_CAPBSET_DROP = 24
_DAC_CAPS = (1, 2, 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER


def _without_dac_override() -> None:  # runs in the child between fork and exec
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in _DAC_CAPS:
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def run(args: list[str], *, mounts: list[str] = ()) -> subprocess.CompletedProcess[str]:
    """``python -m titan_core ARGS`` bound by file modes; ``mounts`` are shell commands run first in a private
    mount namespace."""
    cmd = [sys.executable, "-m", "titan_core", *args]
    if mounts:
        cmd = ["unshare", "-m", "sh", "-c", " && ".join([*mounts, 'exec "$@"']), "sh", *cmd]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=_without_dac_override)


def namespaces_allowed() -> str:
    """'' when ``unshare -m`` with a tmpfs mount works here, else why not."""
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt && touch /mnt/x"],
                           capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"no private mount namespace here: {probe.stderr.strip()[:200]}"


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    return {str(p.relative_to(folder)): (p.stat().st_mode, hashlib.sha1(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("perm") / "run"
    done = run([*SMALL, "--training.steps=4", f"--job.run_dir={run_dir}"])
    assert done.returncode == 0, done.stdout + done.stderr
    return run_dir


def chmod(relative: str, mode: int) -> Callable[[Path], None]:
    return lambda run_dir: (run_dir / relative).chmod(mode)


def old_export(mode: int) -> Callable[[Path], None]:
    def damage(run_dir: Path) -> None:
        (run_dir / "export").mkdir()
        (run_dir / "export" / "model.safetensors").write_bytes(b"an earlier export, kept as it is")
        (run_dir / "export").chmod(mode)
    return damage


@dataclass(frozen=True)
class Case:
    id: str
    damage: Callable[[Path], None]
    fragment: str  # "{run}" is the run folder
    args: tuple[str, ...] = ("--training.steps=6",)
    mounts: tuple[str, ...] = ()


EACCES = [
    Case("run folder not writable", chmod(".", 0o555), "cannot use {run}: permission denied"),
    Case("config.toml read-only", chmod("config.toml", 0o444), "cannot use {run}/config.toml: permission denied"),
    Case("metrics.jsonl read-only", chmod("metrics.jsonl", 0o444), "cannot use {run}/metrics.jsonl: permission denied"),
    Case(".lock read-only", chmod(".lock", 0o444), "cannot use {run}/.lock: permission denied"),
    Case("checkpoint folder not writable", chmod("checkpoints", 0o555),
         "cannot save checkpoints into the checkpoint folder: cannot use {run}/checkpoints: permission denied"),
    Case("export folder not writable", old_export(0o555), "cannot use {run}/export: permission denied",
         args=("--training.steps=6", "--checkpoint.export_at_end=true")),
    Case("run folder below a folder that is not writable", chmod(".", 0o555),
         "cannot use {run}/new: permission denied", args=("--training.steps=2", "--job.run_dir={run}/new")),
]


@pytest.mark.parametrize("case", EACCES, ids=[c.id for c in EACCES])
def test_permission_denied_is_one_line_naming_the_file(case: Case, good_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(good_run, run_dir)
    case.damage(run_dir)
    before = snapshot(run_dir)
    try:
        done = run([*SMALL, f"--job.run_dir={run_dir}", *(a.format(run=run_dir) for a in case.args)])
    finally:
        for path in [run_dir, *run_dir.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() else 0o644)
    text = done.stdout + done.stderr
    assert done.returncode == 2, text
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and case.fragment.format(run=run_dir) in errors[0], text
    assert "Traceback" not in text
    after = snapshot(run_dir)
    assert {k: v[1] for k, v in after.items() if k in before} == {k: v[1] for k, v in before.items()}


def test_read_only_filesystem_and_full_disk(good_run: Path, tmp_path: Path) -> None:
    """EROFS: the run folder on a read-only mount. ENOSPC: the export folder on a full tmpfs (after training:
    the run's last checkpoint is published, the earlier export is kept whole, no temporary file is left)."""
    why = namespaces_allowed()
    if why:
        pytest.skip(why)
    run_dir = tmp_path / "run"
    shutil.copytree(good_run, run_dir)
    before = snapshot(run_dir)
    done = run([*SMALL, f"--job.run_dir={run_dir}", "--training.steps=6"],
               mounts=[f"mount --bind {run_dir} {run_dir}", f"mount -o remount,bind,ro {run_dir}"])
    text = done.stdout + done.stderr
    assert done.returncode == 2, text
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "read-only filesystem" in errors[0] and str(run_dir) in errors[0], text
    assert "Traceback" not in text
    assert snapshot(run_dir) == before

    (run_dir / "export").mkdir()
    earlier = b"an earlier export, kept as it is"
    (run_dir / "export" / "model.safetensors").write_bytes(earlier)
    inner = run_dir / "export"
    done = run([*SMALL, f"--job.run_dir={run_dir}", "--training.steps=6", "--checkpoint.export_at_end=true"],
               mounts=[f"mount -t tmpfs -o size=64k tmpfs {inner}",
                       f"printf '%s' '{earlier.decode()}' > {inner}/model.safetensors"])
    text = done.stdout + done.stderr
    assert done.returncode == 2, text
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"disk full while writing {inner}/model.safetensors" in errors[0], text
    assert "Traceback" not in text
    assert (run_dir / "checkpoints" / "step-000006" / "titan_checkpoint.json").is_file()  # nothing lost
    assert (run_dir / "export" / "model.safetensors").read_bytes() == earlier  # outside the namespace: untouched
