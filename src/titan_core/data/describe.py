"""The run's data in the words of its start-up line: the source, or the mixture with its weights, and
whether documents are masked from each other (a mixture run used to say ``data (builtin)``)."""

from __future__ import annotations

from ..config.sections import DataSection

__all__ = ["describe_data"]


def describe_data(data: DataSection) -> str:
    """``builtin``; ``mixture of 2 sources: code 75% (./code), prose 25% (hf:x)``; ``, document masking``."""
    if data.mix:
        total = sum(m.weight for m in data.mix.values()) or 1.0
        parts = ", ".join(f"{name} {100 * m.weight / total:.3g}% ({m.source})" for name, m in data.mix.items())
        what = f"mixture of {len(data.mix)} source{'s' if len(data.mix) > 1 else ''}: {parts}"
    else:
        what = data.source
    return what + (", document masking" if data.document_masking else "")
