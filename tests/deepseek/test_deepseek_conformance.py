"""The conformance kit's spec-specific quick checks on deepseek_v3's debug MoE flavor: import, meta
build, FLOPs/token against the matmuls really run, and the HF round trip (stacked experts and the
routing bias), each exactly as ``titan-plugin check`` runs it.

The kit's training checks (the loss falling over 30 steps, FSDP2, PP 2, EP 2, init across
layouts, resume) exercise the core's trainer on this model for minutes: they pass
(``titan-plugin check deepseek_v3 --flavor debugmoe``) and are left to that command; this suite
trains the spec through tests/deepseek/test_deepseek_ep.py and test_deepseek_tp.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from titan_core.testing.checks import SPEC_CHECKS, Target, run_check

QUICK = ("import", "meta build", "FLOPs/token vs matmuls", "HF round trip")


def test_the_kits_quick_checks_pass_on_debugmoe(tmp_path: Path) -> None:
    target = Target("spec", "deepseek_v3", flavor="debugmoe", workdir=tmp_path)
    figures = {}
    for check in (c for c in SPEC_CHECKS if c.name in QUICK):
        result = run_check(target, check)
        assert result.status == "pass", f"{check.name}: {result.detail}"
        figures[check.name] = result.figure
    assert sorted(figures) == sorted(QUICK)
    assert figures["meta build"] == "7,273,472 parameters (flavor debugmoe)"
    assert float(figures["FLOPs/token vs matmuls"].split("%")[0]) <= 1.0
    # 3 layers x (8 MLA + 2 norms + router + bias + 3 expert stacks + 3 shared) + 1 dense layer + 3 top-level
    assert figures["HF round trip"] == "66 tensors"


@pytest.mark.parametrize("flavor", ["671B", "Moonlight-16B-A3B"])
def test_the_published_flavors_pass_the_meta_build_check(tmp_path: Path, flavor: str) -> None:
    check = next(c for c in SPEC_CHECKS if c.name == "meta build")
    result = run_check(Target("spec", "deepseek_v3", flavor=flavor, workdir=tmp_path), check)
    assert result.status == "pass", result.detail
