"""Lets a plain ``lm_eval --model titan`` find titan-core's lm-evaluation-harness adapter.

lm_eval 0.4 looks a ``--model`` name up in its registry, which its own ``lm_eval.models`` package
fills; it reads no entry points, so an installed package cannot add a model by metadata. titan-core's
wheel therefore installs ``titan_core_lm_eval.pth``, whose one line imports this module when Python
starts. It imports nothing but the standard library and puts one finder on ``sys.meta_path``: when,
and only when, ``lm_eval.models`` is imported, the name ``titan`` is added to lm_eval's model registry
as a lazy placeholder (``titan_core.commands.lm_eval_model:TitanLM``), which lm_eval imports only
when that model is asked for. Nothing else changes, and a failure here is swallowed: a hook must
never stop Python, or lm_eval, from starting.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing's: importing typing would cost every Python start ~15 ms
if TYPE_CHECKING:  # at run time the import system takes any object with these methods: nothing more is imported
    from collections.abc import Sequence
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType

WATCHED = "lm_eval.models"
NAME = "titan"
PLACEHOLDER = "titan_core.commands.lm_eval_model:TitanLM"


def register_titan() -> None:
    """Add the placeholder to lm_eval's model registry (a no-op when ``titan`` is there already)."""
    try:
        from lm_eval.api.registry import model_registry

        model_registry.register(NAME, target=PLACEHOLDER)
    except Exception:  # noqa: BLE001  another lm_eval, or the name taken: lm_eval answers as it would without us
        pass


class _RegisterAfter:
    """The real loader of ``lm_eval.models``, then the registration."""

    def __init__(self, inner: Loader) -> None:
        self.inner = inner

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self.inner.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        register_titan()


class _WatchLmEvalModels:
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != WATCHED:
            return None
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _RegisterAfter(spec.loader)  # type: ignore[assignment]
                    return spec
        except Exception:  # noqa: BLE001  let the import system find it as usual
            return None
        return None


def install() -> None:
    if not any(isinstance(f, _WatchLmEvalModels) for f in sys.meta_path):
        sys.meta_path.insert(0, _WatchLmEvalModels())


try:
    install()
except Exception:  # noqa: BLE001  never stop the interpreter from starting
    pass
