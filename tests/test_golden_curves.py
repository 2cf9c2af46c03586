"""Golden loss curves: the debugmodel's first 20 losses in six layouts, pinned at 1e-6 relative.

A change that moves any curve fails here until ``scripts/make_golden_curves.py`` is
rerun (and the commit says why the numbers moved). The cases, their arguments and
the runner are the script's own, so the test and the files cannot drift apart.
"""

from __future__ import annotations

import importlib.util
import json
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType

import pytest

from conftest import REPO

RELATIVE = 1e-6


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_golden_curves", REPO / "scripts" / "make_golden_curves.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT = _script()


def _golden(name: str) -> dict:
    return json.loads((SCRIPT.GOLDEN / f"{name}.json").read_text())


def test_every_case_has_a_golden_file_with_its_current_arguments() -> None:
    assert sorted(p.stem for p in SCRIPT.GOLDEN.glob("*.json")) == sorted(SCRIPT.CASES)
    for name, (nproc, extra) in SCRIPT.CASES.items():
        golden = _golden(name)
        assert golden["nproc"] == nproc and golden["args"] == [*SCRIPT.COMMON, *extra], name
        assert len(golden["losses"]) == SCRIPT.STEPS == 20
        assert all(len(curve) == SCRIPT.STEPS for curve in golden.get("losses_by_cpu", {}).values()), name
        # a curve that does not learn would pin nothing interesting
        assert golden["losses"][-1] < golden["losses"][0] - 0.5, name


@pytest.fixture(scope="module")
def curves(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    """The losses of every case selected in this session (the fast tier selects two)."""
    selected = [name for name in SCRIPT.CASES
                if any(item.name == f"test_loss_curve_matches_golden[{name}]" for item in request.session.items)]

    # Made here, not in the threads: two first calls of mktemp at once race to create pytest's base folder.
    folders = {name: tmp_path_factory.mktemp(name) for name in selected}

    def run(name: str) -> list[float]:
        return SCRIPT.run_case(name, folders[name] / "run")

    # Two runs at a time: much of each is process start-up, and 2-process runs share 2 cores anyway.
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(selected, pool.map(run, selected)))


@pytest.mark.parametrize("name", list(SCRIPT.CASES))
def test_loss_curve_matches_golden(name: str, curves: dict[str, list[float]]) -> None:
    golden = _golden(name)
    # Emulated float8/MX casts round through vectorised code that differs between CPUs with and without
    # AVX-512 (5.6e-3 apart after 20 float8 steps): those cases pin one curve per kind of CPU.
    want = golden.get("losses_by_cpu", {}).get(SCRIPT.cpu_kind(), golden["losses"])
    got = curves[name]
    worst = max(abs(g - w) / abs(w) for g, w in zip(got, want))
    assert worst <= RELATIVE, (
        f"{name}: loss curve moved (max relative difference {worst:.2e}); if intended, rerun "
        f"scripts/make_golden_curves.py {name} and say why in the commit.\n got  {got}\n want {want}"
    )
