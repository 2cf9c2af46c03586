"""Entry points with the distribution that declares each (a seam for tests).

The stdlib ``importlib.metadata`` of Python 3.10+ has everything used here
(``entry_points(group=...)`` and ``EntryPoint.dist``), so no backport is needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import metadata


def entry_points_of(group: str) -> Iterator[tuple[metadata.EntryPoint, str, str]]:
    """(entry point, distribution name, distribution version) for every entry point in ``group``."""
    for ep in metadata.entry_points(group=group):
        dist = ep.dist
        name = dist.metadata["Name"] if dist is not None else "<unknown>"
        version = dist.version if dist is not None else "?"
        yield ep, name, version
