"""Module selection for converters: opt-in ``fqns``, opt-out ``filter_fqns``, an eligibility rule.

Shared by every converter plugin so that the same config means the same modules
in each of them (``--float8.fqns`` and ``--mx.fqns`` follow one matching rule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import Field
from torch import nn

from ..errors import ConfigError

M = TypeVar("M", bound=nn.Module)


def filter_fqns_field() -> Any:
    """The ``filter_fqns`` config field every converter declares: the output head is never converted by default."""
    return Field(default_factory=lambda: ["output"],
                 description="Opt-out: linears matching an entry are never converted (default: the output head).")


def moe_fqns_field(kernels: str) -> Any:
    """The ``moe_fqns`` config field: MoE experts (``titan_core.moe.GroupedExperts``) opted in to ``kernels``."""
    return Field(default_factory=list,
                 description="Opt-in: MoE experts (titan_core.moe.GroupedExperts, stacked weights run by grouped GEMM) "
                 f'matching an entry run {kernels} grouped GEMMs, e.g. ["experts"] (default: none; filter_fqns '
                 "applies too).")


def fqn_matches(fqn: str, entry: str) -> bool:
    """True when ``entry``'s dot-separated parts appear consecutively in ``fqn``.

    Whole parts only, so ``"layers.1"`` matches ``layers.1.attention.wq`` but not
    ``layers.10.attention.wq``, and ``"w1"`` matches every ``...feed_forward.w1``.
    """
    return f".{entry}." in f".{fqn}."


def select_linears(
    model: nn.Module,
    *,
    section: str,
    fqns: list[str],
    filter_fqns: list[str],
    eligible: Callable[[str, nn.Linear], bool],
) -> list[str]:
    """Fqns of the linears that match ``fqns`` (all when empty), no ``filter_fqns`` entry, and ``eligible``.

    An ``fqns`` entry that matches no linear at all is a ``ConfigError``: it is
    almost always a typo, and silently converting less than asked is worse.
    """
    return select_modules(model, nn.Linear, key=f"{section}.fqns", fqns=fqns, filter_fqns=filter_fqns,
                          eligible=eligible)


def select_modules(
    model: nn.Module,
    module_type: type[M],
    *,
    key: str,
    fqns: list[str],
    filter_fqns: list[str],
    eligible: Callable[[str, M], bool],
) -> list[str]:
    """Fqns of the ``module_type`` modules that match ``fqns`` (all when empty), no ``filter_fqns``
    entry, and ``eligible``; ``key`` names the setting in errors (an ``fqns`` entry that matches
    no such module is a ``ConfigError``). E.g. a converter's MoE option selects
    ``titan_core.moe.GroupedExperts`` modules."""
    candidates = [(fqn, m) for fqn, m in model.named_modules() if fqn and isinstance(m, module_type)]
    unmatched = [entry for entry in fqns if not any(fqn_matches(fqn, entry) for fqn, _ in candidates)]
    if unmatched:
        raise ConfigError(_unmatched_message(key, module_type.__name__, unmatched, [fqn for fqn, _ in candidates]))
    chosen: list[str] = []
    for fqn, module in candidates:
        if fqns and not any(fqn_matches(fqn, entry) for entry in fqns):
            continue
        if any(fqn_matches(fqn, entry) for entry in filter_fqns):
            continue
        if eligible(fqn, module):
            chosen.append(fqn)
    return chosen


def _unmatched_message(key: str, kind: str, unmatched: list[str], candidates: list[str]) -> str:
    shown = ", ".join(candidates[:6]) + (f" and {len(candidates) - 6} more" if len(candidates) > 6 else "")
    nested = next((fqn for fqn in candidates if fqn.count(".") >= 2), "layers.0.feed_forward.w1")
    example = ".".join(nested.split(".")[-2:])
    what = "nn.Linear" if kind == "Linear" else kind
    return (
        f"{key} entries {unmatched} match no {what} of this model. "
        f"Its {len(candidates)} {what} modules include: {shown or '(none)'}. An entry matches a module whose "
        f'fully qualified name contains the entry as whole dot-separated parts (e.g. "{example}" '
        f'matches "{nested}"). Fix {key}.'
    )
