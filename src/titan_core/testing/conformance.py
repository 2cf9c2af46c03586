"""pytest classes that run the conformance checks inside a plugin author's own test suite.

    from titan_core.testing import ConverterConformance

    class TestMyConverter(ConverterConformance):
        converter = "myconv"     # the entry-point name
        fast = True              # only the checks of `titan-plugin check --fast`

Each check is one test method, running exactly what ``titan-plugin check`` runs; ``compile = True``
adds the ``--compile`` check, as ``titan-plugin check --compile`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import ClassVar

import pytest

from . import checks as c


class _Conformance:
    kind: ClassVar[str] = ""
    fast: ClassVar[bool] = False
    compile: ClassVar[bool] = False
    extra_flags: ClassVar[tuple[str, ...]] = ()
    flavor: ClassVar[str | None] = None  # None: debugmodel, else the spec's default flavor, else its smallest

    _name_attribute: ClassVar[str] = ""  # the class attribute that names the plugin to check

    # A classmethod: pytest 9 deprecates a class-scoped fixture defined as an instance method
    # (PytestRemovedIn10Warning, an error in a suite that turns warnings into errors).
    @pytest.fixture(scope="class")
    @classmethod
    def titan_target(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[c.Target]:
        name = getattr(cls, cls._name_attribute, "")
        if not name:
            pytest.fail(f"{cls.__name__} must set the name of the plugin to check")
        yield c.Target(cls.kind, name, spec=getattr(cls, "spec", "tiny"), compile=cls.compile,
                       extra_flags=tuple(cls.extra_flags), flavor=cls.flavor, workdir=tmp_path_factory.mktemp(f"conformance-{name}"))

    # Shared by both kinds; pytest runs a base class's tests first, so this one opens every suite.
    def test_imports(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_import)

    def test_compiles(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_compile)

    def _run(self, target: c.Target, fn: Callable[[c.Target], str]) -> None:
        check = next((ch for ch in c.checks_for(target, fast=False) if ch.fn is fn), None)
        if check is None:  # only the compile check is left out of a target's list
            pytest.skip("--compile: not asked for (set compile = True to run it)")
        if self.fast and check not in c.checks_for(target, fast=True):
            pytest.skip(f"{check.name}: not in the fast subset (set fast = False to run it)")
        result = c.run_check(target, check)
        if result.status == "skip":
            pytest.skip(f"{check.name}: {result.figure}")
        assert result.status == "pass", f"{check.name}: {result.detail}"


class ConverterConformance(_Conformance):
    """Set ``converter`` (entry-point name); ``spec`` defaults to the core's tiny model."""

    kind = "converter"
    converter: ClassVar[str] = ""
    spec: ClassVar[str] = "tiny"
    _name_attribute = "converter"

    def test_config_defaults_and_did_you_mean(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_config)

    def test_select_and_convert_on_meta(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_select_convert)

    def test_trains_5_steps_and_reports_the_gap(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_train)

    def test_hooks_run_once_per_step(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_hooks)

    def test_fsdp2_matches_one_process(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_fsdp)

    def test_tp2_works_or_refuses_clearly(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_tp)

    def test_resume_is_bit_exact(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_resume)


class TrainSpecConformance(_Conformance):
    """Set ``train_spec`` (entry-point name)."""

    kind = "spec"
    train_spec: ClassVar[str] = ""
    _name_attribute = "train_spec"

    def test_builds_on_meta(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_meta_build)

    def test_flops_per_token_matches_the_matmuls(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_flops)

    def test_hf_round_trip(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_hf_roundtrip)

    def test_loss_falls_over_30_steps(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_loss_falls)

    def test_fsdp2_matches_one_process(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_fsdp)

    def test_tp2_matches_one_process(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_tp)

    def test_pp2_matches_one_process(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_pp)

    def test_cp2_matches_one_process(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_cp)

    def test_ep2_matches_one_process(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_ep)

    def test_init_identical_across_layouts(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_init_layouts)

    def test_resume_is_bit_exact(self, titan_target: c.Target) -> None:
        self._run(titan_target, c.check_resume)
