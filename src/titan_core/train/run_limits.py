"""The run's deadlines, from its config, put where the bounded code reads them.

Plugin calls and ``hf:`` reads happen deep inside code whose signatures plugins also
implement (``build_dataloader_fn``), so the limits are not threaded through them as
arguments: ``titan-train`` sets them once, after the config is resolved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..data.sources import set_hf_timeout
from ..plugin.guard import set_plugin_timeout

if TYPE_CHECKING:
    from ..config.job import JobConfig

__all__ = ["apply_run_limits"]


def apply_run_limits(config: JobConfig) -> None:
    """``model.plugin_timeout_s`` and ``data.hf_timeout_s`` take effect in this process."""

    set_plugin_timeout(config.model.plugin_timeout_s)
    set_hf_timeout(config.data.hf_timeout_s)
