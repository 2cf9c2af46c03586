"""titan-core: the shared LLM pre-training runtime; models and converters are plugins.

The public API is ``__all__``. Names are loaded lazily, so ``titan-train --list``
and ``--help`` never pay for torch, datasets or tiktoken until something needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _moved
from ._version import PLUGIN_API_VERSION as PLUGIN_API_VERSION, __version__ as __version__
from .runtime.torch_floor import require_torch_floor

# A torch older than the floor ends the process here (one message, exit 2), not in a traceback later.
require_torch_floor()

_moved.install()  # old import paths of modules that moved into packages keep working (docs/plugins.md)


def _lazy_table(source: str = __file__) -> dict[str, str]:
    """public name -> the module that defines it, read from the ``TYPE_CHECKING`` imports of ``source`` (this
    file, or ``plugin_api.py``): the one list of public names, which type checkers read as re-exports."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(source).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    table: dict[str, str] = {}
    for node in block.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        for alias in node.names:
            if alias.name == "*":  # ``from .plugin_api import *``: the contract's names, served by that module
                served = importlib.import_module(f"{__name__}.{module}").__all__
                table.update(dict.fromkeys((n for n in served if n != "PLUGIN_API_VERSION"), module))
            else:
                table[alias.asname or alias.name] = module
    return table


def _load_lazily(name: str, table: dict[str, str], namespace: dict[str, Any]) -> Any:
    """``name`` from its module in ``table``, kept in ``namespace`` (the globals of this package or of plugin_api)."""
    module = table.get(name)
    if module is None:
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    namespace[name] = value
    return value


# Filled on first use, not at import: parsing this file (and importing plugin_api for its names) costs about
# 2 ms that commands which never touch a public name (``titan-data prepare``, ``--help``) need not pay.
_LAZY: dict[str, str] = {}


def _lazy() -> dict[str, str]:
    if not _LAZY:
        _LAZY.update(_lazy_table())
    return _LAZY


def __getattr__(name: str) -> Any:
    if name == "__all__":  # asked for by ``from titan_core import *``, ``dir()`` and tools: built once, then kept
        names = ["PLUGIN_API_VERSION", "__version__", *_lazy()]
        globals()["__all__"] = names
        return names
    return _load_lazily(name, _lazy(), globals())


def __dir__() -> list[str]:
    return sorted(globals().get("__all__") or __getattr__("__all__"))


if TYPE_CHECKING:
    # "X as X": the explicit re-export form, so type checkers see the lazy names as public. The plugin
    # contract's names are plugin_api's (its __all__), listed there once.
    from .checkpoint import (
        CheckpointManager as CheckpointManager,
        ResumeInfo as ResumeInfo,
        RunIdentity as RunIdentity,
        collect_param_shapes as collect_param_shapes,
        export_safetensors as export_safetensors,
        read_checkpoint_tensors as read_checkpoint_tensors,
    )
    from .commands.titan_train import main as main
    from .config.job import JobConfig as JobConfig
    from .config.sections import (
        CheckpointSection as CheckpointSection,
        ModelSection as ModelSection,
    )
    from .data.documents import split_documents as split_documents
    from .data.tokenizer import TiktokenTokenizer as TiktokenTokenizer
    from .errors import (
        CheckpointError as CheckpointError,
        NonFiniteError as NonFiniteError,
        PeerLost as PeerLost,
        RunFolderBusy as RunFolderBusy,
        StopRequested as StopRequested,
    )
    from .models.kv_cache import KVCache as KVCache
    from .models.sampling import (
        Sampling as Sampling,
        sample as sample,
    )
    from .moe import MoEMonitor as MoEMonitor
    from .observability.report import write_run_report as write_run_report
    from .plugin_api import *  # noqa: F403
    from .runtime.run_lock import acquire_run_lock as acquire_run_lock
    from .train.converters import (
        ConversionTable as ConversionTable,
        apply_converters as apply_converters,
    )
    from .train.trainer import Trainer as Trainer
