"""Plugins frozen as they were written for plugin API 1.0 pass ``titan-plugin check`` on this core.

``third_party/`` (README.md here says where each comes from) holds this repository's
example plugins and the ``titan-plugin new`` scaffolds as they were at 7792db9, the last commit
before the core changed what it handed plugins, plus ``titan-compat-reader``, written from the
1.0 docs to read every documented field. All are built as wheels in one ``pip wheel`` call and
installed together into one folder put on ``PYTHONPATH`` (the core and torch come from this
environment), then checked as a plugin author would check them: the quick subset for all of
them in one ``titan-plugin check`` call; the reader, whose ``parallelize_fn``
maps ``parallelism.param_dtype`` through its own table (the break of issue 28), is also trained
under FSDP2 on two processes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import run_ok

THIRD_PARTY = Path(__file__).resolve().parent / "third_party"
PLUGINS = ["titan-tinygpt", "titan-int8-fake", "scaffold-spec", "scaffold-converter", "titan-compat-reader"]
ENTRY_POINTS = ["tinygpt", "int8fake", "compat_spec", "compat_conv", "compat_reader", "compat_reader_conv"]


@dataclass
class Installed:
    site: Path
    fsdp2: subprocess.Popen[str]  # the reader's 2-process run, started at once: the checks use one core


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("compat")
    run_ok([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"),
            *(str(THIRD_PARTY / p) for p in PLUGINS)])
    wheels = sorted(str(w) for w in (root / "dist").glob("*.whl"))
    assert len(wheels) == len(PLUGINS)
    site = root / "site"
    run_ok([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), *wheels])
    fsdp2 = subprocess.Popen(
        [sys.executable, "-m", "titan_core", "--spec", "compat_reader", "--converters", "compat_reader_conv",
         "--nproc-per-node", "2", "--training.steps=2", "--training.seq_len=32", "--training.local_batch_size=2",
         "--metrics.log_freq=1", "--metrics.report=false", f"--job.run_dir={root / 'fsdp2'}"],
        cwd=root, env=_env(site), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield Installed(site, fsdp2)
    if fsdp2.poll() is None:
        fsdp2.kill()
        fsdp2.communicate()


def _env(site: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    env.pop("TITAN_DEFAULT_SPEC", None)
    return env


def test_every_compat_plugin_passes_the_quick_checks(installed: Installed) -> None:
    code = "import sys; from titan_core.plugin_cli import main; sys.exit(main())"
    done = subprocess.run([sys.executable, "-c", code, "check", *ENTRY_POINTS, "--fast"], cwd=installed.site.parent,
                          env=_env(installed.site), capture_output=True, text=True, timeout=900)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    for name in ENTRY_POINTS:  # each checked, by name, with the API it declares
        kind = "converter" if name in ("int8fake", "compat_conv", "compat_reader_conv") else "spec"
        assert f"{kind} {name}\n" in done.stdout, name
    assert done.stdout.count(", API 1.0 ") == len(ENTRY_POINTS), done.stdout
    assert " FAIL " not in done.stdout and "titan-plugin check: all checks passed" in said, said


def test_the_reader_trains_under_fsdp2_on_two_processes(installed: Installed) -> None:
    """The path the break of issue 28 showed on ("FSDP2 x2 = 1 process"): the reader's parallelize_fn and its
    converter's __init__ read parallelism.param_dtype through their tables with a real 2-rank mesh."""
    said, _ = installed.fsdp2.communicate(timeout=600)
    assert installed.fsdp2.returncode == 0, said
    records = (installed.site.parent / "fsdp2/metrics.jsonl").read_text().splitlines()
    losses = [json.loads(line)["loss"] for line in records if '"loss"' in line]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), losses
    assert "device cpu, 2 processes" in said and "parameters: 21 x dp_shard:S(0)" in said, said
