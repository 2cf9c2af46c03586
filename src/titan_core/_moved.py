"""Old import paths of modules that moved into packages (plugin API 1.1), kept working.

Until plugin API 1.1 most of ``titan_core`` sat in one flat folder, and plugins written from the
docs imported helpers by those paths (``titan_core.model_parts``, ``titan_core.hf_names``,
``titan_core.deferred``, ...). The modules now live in packages named for what they are; this
finder lets ``import titan_core.<old>`` and ``from titan_core.<old> import x`` land on the moved
module (the same module object, not a copy) with a ``DeprecationWarning`` naming the new path.
The policy (docs/plugins.md): an old path keeps working for at least one minor version and is
removed only with the next major plugin API. Imports only the standard library.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the type checker sees the protocol's base class; at run time it is not imported (below)
    from importlib.abc import Loader as _LoaderBase
else:
    _LoaderBase = object

# old name under titan_core -> new name under titan_core (a package's submodules follow it)
MOVED: dict[str, str] = {
    "_contract_check": "testing.contract_check",
    "_metadata": "plugin.entry_points",
    "build": "train.build",
    "cli": "commands.titan_train",
    "converters": "train.converters",
    "deferred": "plugin.deferred",
    "discovery": "plugin.discovery",
    "distributed": "parallel.distributed",
    "emulation": "plugin.emulation",
    "finite_watch": "train.finite_watch",
    "folder_locks": "runtime.folder_locks",
    "folder_publish": "runtime.folder_publish",
    "grad_norm": "train.grad_norm",
    "hf_names": "models.hf_names",
    "init": "models.init",
    "kv_cache": "models.kv_cache",
    "loss": "models.loss",
    "memory_estimate": "train.memory_estimate",
    "meta_model": "boundary.meta_model",
    "metrics": "observability.metrics",
    "model_parts": "models.model_parts",
    "optimizer_settings": "optim.settings",
    "os_errors": "runtime.os_errors",
    "parallel_dims": "config.parallel_dims",
    "param_groups": "optim.param_groups",
    "parameter_layout": "parallel.parameter_layout",
    "path_settings": "runtime.path_settings",
    "plugin_boundary": "boundary.plugin_boundary",
    "plugin_calls": "plugin.guard",
    "plugin_cli": "commands.titan_plugin",
    "precision": "parallel.precision",
    "preflight": "train.preflight",
    "profiling": "observability.profiling",
    "protocols": "plugin.protocols",
    "report": "observability.report",
    "run_files": "runtime.run_files",
    "run_limits": "train.run_limits",
    "sampling": "models.sampling",
    "section_names": "plugin.section_names",
    "selection": "plugin.selection",
    "spec_factories": "plugin.spec_factories",
    "stop_on_signal": "train.stop_on_signal",
    "tensorboard_writer": "observability.tensorboard_writer",
    "text_files": "data.text_files",
    "ties": "models.ties",
    "token_ids": "data.token_ids",
    "token_loss": "train.token_loss",
    "tokenizer": "data.tokenizer",
    "tp_styles": "train.tp_styles",
    "trainer": "train.trainer",
    "whole_model": "train.whole_model",
}


def new_name(fullname: str) -> str | None:
    """``titan_core.<old>[.sub]`` -> ``titan_core.<new>[.sub]``; None for a name that did not move."""
    prefix, _, rest = fullname.partition(".")
    if prefix != "titan_core" or not rest:
        return None
    head, dot, tail = rest.partition(".")
    if head not in MOVED:
        return None
    return f"titan_core.{MOVED[head]}{dot}{tail}"


# The finder and loader protocols by their methods, not importlib.abc's base classes: importing
# importlib.abc pulls in importlib.resources, a tenth of numpy's import, on every command's start-up.
class _AliasLoader(_LoaderBase):
    """Hands out the moved module itself; its own ``__spec__`` is put back after import machinery
    stamps the alias's spec on it, so the module keeps one identity."""

    def __init__(self, old: str, new: str) -> None:
        self.old = old
        self.new = new
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{self.old} moved to {self.new}; the old path works until plugin API 2.0. Import the new path, "
            f"or the public names from titan_core / titan_core.plugin_api.",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec


class _MovedModuleFinder:
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname, new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (called by ``titan_core/__init__.py``)."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
