"""The conformance kit on plugins written by other people (tests/_third_party_plugins.py): each
broken contract fails the check that covers it, with a message naming what is wrong; correct
plugins of unusual shape pass. Mostly in-process; two short TP runs for the refusal/crash verdicts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from titan_core.testing import CheckResult, Target
from titan_core.testing.checks import CONVERTER_CHECKS, SPEC_CHECKS, run_check

from conftest import REPO

TESTS = REPO / "tests"


@pytest.fixture(scope="module", autouse=True)
def third_party() -> Iterator[None]:
    import _third_party_plugins as plugins

    yield
    for handle in plugins.GLOBAL_HOOKS:  # TwiceHook's global optimizer hooks would outlive this module
        handle.remove()


def _check(kind: str, name: str, check: str, workdir: Path) -> CheckResult:
    pool = CONVERTER_CHECKS if kind == "converter" else SPEC_CHECKS
    return run_check(Target(kind, name, workdir=workdir), next(c for c in pool if c.name == check))


def test_convert_changing_modules_outside_the_selection_fails(tmp_path: Path) -> None:
    cast = _check("converter", "casts_norms", "select/convert on meta", tmp_path)
    assert cast.status == "fail" and cast.figure == "5 outside, 0 unchanged", cast
    assert "changed 5 module(s) select() did not choose: ['layers.0.attention_norm'" in cast.detail, cast
    graft = _check("converter", "grafter", "select/convert on meta", tmp_path)
    assert graft.status == "fail" and "convert() added modules ['amax_history']" in graft.detail, graft
    fine = _check("converter", "tp_crashes", "select/convert on meta", tmp_path)  # the same rewrite, nothing more
    assert (fine.status, fine.figure) == ("pass", "14 modules"), fine


def test_hooks_registered_twice_fail_and_an_instance_hook_counts(tmp_path: Path) -> None:
    twice = _check("converter", "twice_hook", "hooks once per step", tmp_path / "a")
    # The core's hook plus the global one (which also fires for the optimizer container's own step).
    ran = re.search(r"over 3 steps the hooks ran pre x3, post x(\d+), not once per step", twice.detail)
    assert twice.status == "fail" and ran is not None and int(ran.group(1)) > 3, twice
    assert "also registers them itself" in twice.detail
    once = _check("converter", "instance_hook", "hooks once per step", tmp_path / "b")
    assert (once.status, once.figure) == ("pass", "3 steps: pre 3, post 3"), once


def test_spec_verdicts_without_training(tmp_path: Path) -> None:
    doubled = _check("spec", "flops_2x", "FLOPs/token vs matmuls", tmp_path)
    off = re.fullmatch(r"(\d+\.\d)% off", doubled.figure)  # declared = 2 x counted: ~100% off
    assert doubled.status == "fail" and off is not None and 90 < float(off.group(1)) < 110, doubled
    assert "flops_per_token" in doubled.detail and "off the counted" in doubled.detail
    plain = {c: _check("spec", "plain_gpt", c, tmp_path) for c in
             ("FLOPs/token vs matmuls", "meta build", "TP 2 = 1 process", "PP 2 = 1 process", "HF round trip")}
    assert plain["FLOPs/token vs matmuls"].status == "pass", plain
    assert plain["meta build"].status == "pass" and plain["meta build"].figure.endswith("parameters")
    assert (plain["TP 2 = 1 process"].status, plain["TP 2 = 1 process"].figure) == ("skip", "no TP plan")
    assert (plain["PP 2 = 1 process"].status, plain["PP 2 = 1 process"].figure) == ("skip", "no pipelining_fn")
    assert (plain["HF round trip"].status, plain["HF round trip"].figure) == ("skip", "no state_dict_adapter")


def test_tp_refused_up_front_passes_a_crash_in_the_workers_or_no_tp_at_all_fails(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    flags = ("--import", "_third_party_plugins")
    refused = run_check(Target("converter", "tp_refuses", workdir=tmp_path / "r", extra_flags=flags),
                        next(c for c in CONVERTER_CHECKS if c.name == "TP 2 works or refuses"))
    assert refused.status == "pass" and refused.figure.startswith("refused: tp_refuses rounds whole"), refused
    crashed = run_check(Target("converter", "tp_crashes", workdir=tmp_path / "c", extra_flags=flags),
                        next(c for c in CONVERTER_CHECKS if c.name == "TP 2 works or refuses"))
    assert crashed.status == "fail" and crashed.figure == "failed in workers", crashed
    assert "the tensor-parallel plan gives a column- or row-wise style to modules that are neither linear nor " \
        "embedding layers" in crashed.detail
    assert "refuses in __init__ (parallel_dims.tp_enabled)" in crashed.detail
    ignored = run_check(Target("spec", "ignores_tp", workdir=tmp_path / "i", extra_flags=flags),
                        next(c for c in SPEC_CHECKS if c.name == "TP 2 = 1 process"))
    assert ignored.status == "fail" and ignored.figure == "nothing sharded", ignored
    assert "the parallelize_fn ignored parallelism.tp" in ignored.detail


def test_a_plugin_that_fails_to_import_gets_one_row_not_a_traceback_per_check(tmp_path: Path) -> None:
    """An installed entry point whose module raises: the table shows the import failing, the rest not run."""
    site = tmp_path / "site"
    (site / "broken_conv_pkg").mkdir(parents=True)
    (site / "broken_conv_pkg/__init__.py").write_text("import thirdparty_native_kernels  # not installed\n")
    info = site / "broken_conv-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-conv\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent("""
        [titan.model_converters]
        broken_conv = broken_conv_pkg:Conv
    """))
    proc = subprocess.run([sys.executable, "-m", "titan_core.commands.titan_plugin", "check", "broken_conv"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {line[:29].strip(): line[29:].split() for line in proc.stdout.splitlines()[3:11]}
    assert rows["import"][:2] == ["FAIL", "PluginError"], proc.stdout
    assert [rows[c.name][:2] for c in CONVERTER_CHECKS[1:]] == [["skip", "not"]] * (len(CONVERTER_CHECKS) - 1)
    assert proc.stdout.count("No module named 'thirdparty_native_kernels'") == 1 and "\nimport failed:" in proc.stdout
    lines = proc.stdout.splitlines()
    assert lines[0] == "converter broken_conv" and lines[1].split() == ["check", "result", "figure", "time"]
    assert "titan-plugin check: FAILED" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and "kept in" not in proc.stdout


def test_init_that_depends_on_the_rank_fails_the_layout_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    target = Target("spec", "rank_init", workdir=tmp_path, extra_flags=("--import", "_third_party_plugins"))
    fsdp, init = (run_check(target, next(c for c in SPEC_CHECKS if c.name == name))
                  for name in ("FSDP2 x2 = 1 process", "init identical across layouts"))
    assert fsdp.status == "fail" and "fsdp2 losses" in fsdp.detail, fsdp
    assert init.status == "fail" and init.figure.startswith("fsdp2: "), init
    assert "the initial weights depend on the layout" in init.detail


def test_an_import_that_never_returns_fails_the_import_row_instead_of_hanging(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_core.testing import checks

    (tmp_path / "stuck_conv_pkg").mkdir()
    (tmp_path / "stuck_conv_pkg/__init__.py").write_text("import time\ntime.sleep(60)  # waits for a server\n")
    info = tmp_path / "stuck_conv-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: stuck-conv\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[titan.model_converters]\nstuck_conv = stuck_conv_pkg:Conv\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(checks, "IMPORT_TIMEOUT_S", 2.0)
    results = checks.run_all(Target("converter", "stuck_conv", workdir=tmp_path / "runs"), fast=True)
    assert (results[0].name, results[0].status, results[0].figure) == ("import", "fail", "timed out"), results[0]
    assert "did not finish within 2 s" in results[0].detail and results[0].seconds < 10
    assert {r.status for r in results[1:]} == {"skip"}
