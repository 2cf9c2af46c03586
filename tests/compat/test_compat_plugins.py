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
from pathlib import Path

import pytest

from conftest import run_ok

THIRD_PARTY = Path(__file__).resolve().parent / "third_party"
PLUGINS = ["titan-tinygpt", "titan-int8-fake", "scaffold-spec", "scaffold-converter", "titan-compat-reader"]
ENTRY_POINTS = ["tinygpt", "int8fake", "compat_spec", "compat_conv", "compat_reader", "compat_reader_conv"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("compat")
    run_ok([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"),
            *(str(THIRD_PARTY / p) for p in PLUGINS)])
    wheels = sorted(str(w) for w in (root / "dist").glob("*.whl"))
    assert len(wheels) == len(PLUGINS)
    run_ok([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(root / "site"),
            *wheels])
    return root / "site"


def _check(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    env.pop("TITAN_DEFAULT_SPEC", None)
    code = "import sys; from titan_core.plugin_cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, "check", *args], cwd=site.parent, env=env,
                          capture_output=True, text=True, timeout=600)


def test_every_compat_plugin_passes_the_quick_checks(site: Path) -> None:
    done = _check(site, *ENTRY_POINTS, "--fast")
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ENTRY_POINTS:  # each checked, by name, with its declared API
        kind = "converter" if name in ("int8fake", "compat_conv", "compat_reader_conv") else "spec"
        assert f"{kind} {name}\n" in done.stdout, name
    assert done.stdout.count("API 1.0") == len(ENTRY_POINTS), done.stdout
    assert " FAIL " not in done.stdout and "titan-plugin check: all checks passed" in done.stdout, done.stdout


def test_the_reader_trains_under_fsdp2_on_two_processes(site: Path) -> None:
    """The path the break of issue 28 showed on ("FSDP2 x2 = 1 process"): the reader's parallelize_fn and its
    converter's __init__ read parallelism.param_dtype through their tables with a real 2-rank mesh."""
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "titan_core", "--spec", "compat_reader", "--converters",
                           "compat_reader_conv", "--nproc-per-node", "2", "--training.steps=2",
                           "--training.seq_len=32", "--training.local_batch_size=2", "--metrics.log_freq=1",
                           f"--job.run_dir={site.parent / 'fsdp2'}"],
                          cwd=site.parent, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    losses = [json.loads(line)["loss"] for line in (site.parent / "fsdp2/metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), losses
