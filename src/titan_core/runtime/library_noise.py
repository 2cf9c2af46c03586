"""Warnings of libraries a plugin imports that say nothing a user can act on, kept out of their output.

torchao, imported by the float8 and MX plugins, tries to load every compiled extension it ships
(``_C_mxfp8...so``, ``_C_cutlass_90a...so``) and logs ``Failed to load <path>: ...`` for each that
does not fit this machine (built for another Python, torch or CUDA). On a CPU run, where the
matmuls are emulated anyway, those lines are noise; on a GPU they mean torchao's own fused kernels
are missing, which is said once, in words (``kernel_load_note``). Its import also makes torch log,
once per enum torchao registers, that ``register_constant()`` on an Enum is deprecated: a note to
torchao's authors, dropped too. Only those records are dropped: every other message passes. The core never imports torchao: the filter sits on the logger's
name, which needs no import.
"""

from __future__ import annotations

import logging
import os

_TORCHAO_LOGGER = "torchao"
_PYTREE_LOGGER = "torch.utils._pytree"
_failed: list[str] = []  # the extension files torchao could not load, in the order it said


class _DropFailedExtensionLoads(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.levelno == logging.WARNING and message.startswith("Failed to load ") and ".so" in message:
            path = message[len("Failed to load "):].split(":", 1)[0]
            _failed.append(os.path.basename(path))
            return False
        return True


class _DropEnumConstantDeprecation(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("is an Enum subclass" in message and "register_constant()" in message)


_FILTER = _DropFailedExtensionLoads()
_PYTREE_FILTER = _DropEnumConstantDeprecation()


def quiet_torchao_extension_loads() -> None:
    """Drop torchao's "Failed to load <extension>" warnings (idempotent; before any plugin imports torchao)."""
    for name, drop in ((_TORCHAO_LOGGER, _FILTER), (_PYTREE_LOGGER, _PYTREE_FILTER)):
        logger = logging.getLogger(name)
        if drop not in logger.filters:
            logger.addFilter(drop)


def kernel_load_note() -> str | None:
    """One sentence for a GPU run when torchao could not load its compiled extensions; None when all loaded."""
    if not _failed:
        return None
    names = ", ".join(sorted(set(_failed)))
    return (f"torchao could not load {len(set(_failed))} of its compiled extensions ({names}: built for another "
            "Python, torch or CUDA), so its own fused kernels are not available; reinstall a torchao built for this "
            "torch to get them.")


__all__ = ["kernel_load_note", "quiet_torchao_extension_loads"]
