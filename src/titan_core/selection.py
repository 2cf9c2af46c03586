"""Module selection for converters: opt-in ``fqns``, opt-out ``filter_fqns``, an eligibility rule.

Shared by every converter plugin so that the same config means the same modules
in each of them (``--float8.fqns`` and ``--mx.fqns`` follow one matching rule).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from .errors import ConfigError


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
    linears = [(fqn, m) for fqn, m in model.named_modules() if fqn and isinstance(m, nn.Linear)]
    unmatched = [entry for entry in fqns if not any(fqn_matches(fqn, entry) for fqn, _ in linears)]
    if unmatched:
        raise ConfigError(_unmatched_message(section, unmatched, [fqn for fqn, _ in linears]))
    chosen: list[str] = []
    for fqn, module in linears:
        if fqns and not any(fqn_matches(fqn, entry) for entry in fqns):
            continue
        if any(fqn_matches(fqn, entry) for entry in filter_fqns):
            continue
        if eligible(fqn, module):
            chosen.append(fqn)
    return chosen


def _unmatched_message(section: str, unmatched: list[str], linears: list[str]) -> str:
    shown = ", ".join(linears[:6]) + (f" and {len(linears) - 6} more" if len(linears) > 6 else "")
    nested = next((fqn for fqn in linears if fqn.count(".") >= 2), "layers.0.feed_forward.w1")
    example = ".".join(nested.split(".")[-2:])
    return (
        f"{section}.fqns entries {unmatched} match no nn.Linear of this model. "
        f"Its {len(linears)} linear layers include: {shown or '(none)'}. An entry matches a module whose "
        f'fully qualified name contains the entry as whole dot-separated parts (e.g. "{example}" '
        f'matches "{nested}"). Fix {section}.fqns.'
    )
