"""The conformance kit itself: a converter that breaks the contract fails the check that covers it,
and the pytest classes run the same checks. (The table and exit 1 of ``titan-plugin check`` on a failing
plugin: test_conformance_verdicts.py; on passing ones: the guide test in test_wheels.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO

LIARS = textwrap.dedent('''
    from titan_core import ModelConverter, register_model_converter
    from torch import nn

    class Liar(ModelConverter):
        """Selects a module the model does not have."""
        plugin_api_version = "1.0"
        def select(self, model): return ["layers.0.attention.nope"]
        def convert(self, model, fqns): pass

    class Overreach(ModelConverter):
        """Selects one linear and converts two."""
        plugin_api_version = "1.0"
        def select(self, model): return ["layers.0.attention.wq"]
        def convert(self, model, fqns):
            for name in ("layers.0.attention.wq", "layers.0.attention.wk"):
                model.get_submodule(name).__class__ = type("Converted", (nn.Linear,), {})

    register_model_converter("liar", Liar)
    register_model_converter("overreach", Overreach)
''')


@pytest.fixture()
def liars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "liars.py").write_text(LIARS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return tmp_path


def test_select_convert_check_catches_both_lies(liars: Path) -> None:
    import liars as _  # noqa: F401  (registers the two converters)

    from titan_core.testing import Target
    from titan_core.testing.checks import CONVERTER_CHECKS, run_check

    check = next(c for c in CONVERTER_CHECKS if c.name == "select/convert on meta")
    lie = run_check(Target("converter", "liar", workdir=liars), check)
    assert lie.status == "fail" and "layers.0.attention.nope" in lie.detail, lie
    over = run_check(Target("converter", "overreach", workdir=liars), check)
    assert over.status == "fail" and "convert() changed" in over.detail and "attention.wk" in over.detail, over


def test_the_pytest_class_runs_the_checks_on_an_installed_converter(tmp_path: Path) -> None:
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "-q"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
                            str(REPO / "examples/titan-int8-fake")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("titan_int8_fake-*.whl")
    installed = subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    test_file = REPO / "examples/titan-int8-fake/tests/test_conformance.py"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(test_file)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 passed, 4 skipped" in proc.stdout and "not in the fast subset" in proc.stdout, proc.stdout


@pytest.mark.parametrize(("guide", "pool"), [("writing-a-converter.md", "CONVERTER_CHECKS"),
                                             ("writing-a-train-spec.md", "SPEC_CHECKS")])
def test_the_guides_list_every_check_in_order(guide: str, pool: str) -> None:
    from titan_core.testing import checks

    text = (REPO / "docs" / guide).read_text()
    table = text.split("| check | what passes |\n|---|---|\n", 1)[1].split("\n\n", 1)[0]
    assert [row.split("|")[1].strip() for row in table.splitlines()] == [c.name for c in getattr(checks, pool)]


def test_the_kit_trains_debugmodel_else_the_specs_default_else_its_smallest_flavor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A spec written elsewhere need not have a debugmodel flavor: every check then failed on it."""
    import dataclasses

    from titan_core import register_train_spec
    from titan_core.plugin import discovery

    # In-process registrations for this test only: later tests count the installed specs.
    monkeypatch.setitem(discovery._registered, discovery.SPECS, dict(discovery._registered[discovery.SPECS]))
    from titan_core.testing import checks
    from titan_core.testing.tiny_spec import TINY_SPEC, TinyArgs

    small, big = TinyArgs(), dataclasses.replace(TinyArgs(), dim=256)
    register_train_spec(dataclasses.replace(TINY_SPEC, name="kit_flavors_small_last", flavors={"big": big, "small": small}))
    register_train_spec(dataclasses.replace(TINY_SPEC, name="kit_flavors_default", flavors={"big": big, "small": small},
                                            defaults={"model": {"flavor": "big"}}))
    register_train_spec(dataclasses.replace(TINY_SPEC, name="kit_flavors_debug",
                                            flavors={"debugmodel": big, "small": small}))
    assert checks.choose_flavor("kit_flavors_small_last") == "small"
    assert checks.choose_flavor("kit_flavors_default") == "big"
    assert checks.choose_flavor("kit_flavors_debug") == "debugmodel"
    assert checks.choose_flavor("tiny") == "debugmodel"
    target = checks.Target("spec", "kit_flavors_small_last")
    assert "--flavor small" in " ".join(target.base_flags(5))
    assert checks.check_meta_build(target) == "393,536 parameters (flavor small)"
    named = checks.Target("spec", "kit_flavors_small_last", flavor="big")
    assert "--flavor big" in " ".join(named.base_flags(5))

    # A toy model with fewer positions than the kit's 64-token sequences is trained on its own limit.
    @dataclasses.dataclass(frozen=True)
    class ShortArgs(TinyArgs):
        max_seq_len: int = 32

    register_train_spec(dataclasses.replace(TINY_SPEC, name="kit_short", flavors={"debugmodel": ShortArgs()}))
    short = checks.Target("spec", "kit_short")
    assert "--training.seq_len=32" in short.base_flags(5)
    assert checks.check_meta_build(short) == "393,536 parameters"
    assert "--training.seq_len=64" in checks.Target("spec", "tiny").base_flags(5)


@pytest.mark.parametrize(("kit", "pool"), [("ConverterConformance", "CONVERTER_CHECKS"), ("TrainSpecConformance", "SPEC_CHECKS")])
def test_each_check_is_one_test_method_of_its_pytest_class(kit: str, pool: str) -> None:
    """`titan-plugin check` and the pytest classes run the same checks: a check added to a list without its
    test method (as CP once was) would go unrun in plugin authors' suites."""
    import inspect
    import re

    from titan_core.testing import checks, conformance

    cls = getattr(conformance, kit)
    called: list[str] = []
    for name in dir(cls):
        if name.startswith("test_"):
            called += re.findall(r"c\.(check_\w+)\)", inspect.getsource(getattr(cls, name)))
    expected = [ch.fn.__name__ for ch in [*getattr(checks, pool), checks.COMPILE_CHECK]]
    assert sorted(called) == sorted(expected)
