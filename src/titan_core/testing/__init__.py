"""The conformance kit for plugin authors: the checks ``titan-plugin check`` runs, as pytest
classes.

``ConverterConformance`` and ``TrainSpecConformance`` need pytest (imported on first use);
``run_checks`` returns the results ``titan-plugin check`` prints.

Also ``contract_check``, which only mypy reads: it checks that the core's default factories satisfy
the protocols of ``plugin.spec_factories``. May import ``train`` and everything below it; only
``commands`` imports it.
"""

from __future__ import annotations

from typing import Any

from .checks import CheckResult, Target, run_all

__all__ = ["CheckResult", "ConverterConformance", "Target", "TrainSpecConformance", "run_checks"]


def run_checks(target: Target, *, fast: bool = False) -> list[CheckResult]:
    """Run every check that applies to ``target`` (only the fast subset with ``fast``), in order."""
    return run_all(target, fast=fast)


def __getattr__(name: str) -> Any:
    if name in ("ConverterConformance", "TrainSpecConformance"):
        from . import conformance  # optional dependency: it needs pytest, the rest of the kit does not

        return getattr(conformance, name)
    raise AttributeError(f"module 'titan_core.testing' has no attribute {name!r}")
