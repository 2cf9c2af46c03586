"""``titan-train --trainer MODULE:CLASS`` (or ``titan_core.main(trainer_class=...)``): the Trainer
subclass a run uses, checked before anything is built.

The class is named by an import path rather than passed as an object so that every worker
of ``--nproc-per-node`` (and of a fault-tolerant replica group) imports the same one.
"""

from __future__ import annotations

import importlib

from ..errors import ConfigError
from ..train.trainer import Trainer

_FORM = "give MODULE:CLASS, a Trainer subclass in an importable module (e.g. --trainer my_pkg.trainers:MyTrainer)"


def load_trainer_class(ref: str) -> type[Trainer]:
    """The class ``ref`` names; ConfigError (exit 2) when it cannot be imported or is no Trainer subclass."""
    module_name, sep, qualname = ref.partition(":")
    if not sep or not module_name.strip() or not qualname.strip():
        raise ConfigError(f"--trainer {ref!r}: {_FORM}.")
    try:
        found: object = importlib.import_module(module_name)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # its own sys.exit() is an error too
        raise ConfigError(f"--trainer {ref}: the module {module_name} could not be imported ({type(exc).__name__}: "
                          f"{exc}). Check the name and that its package is installed or on PYTHONPATH "
                          f"(--traceback shows where it failed).") from exc
    for part in qualname.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ConfigError(f"--trainer {ref}: the module {module_name} has no {qualname}; {_FORM}.") from None
    return checked_trainer_class(found, what=f"--trainer {ref}")


def checked_trainer_class(found: object, *, what: str) -> type[Trainer]:
    if not (isinstance(found, type) and issubclass(found, Trainer)):
        kind = f"the class {found.__name__}" if isinstance(found, type) else f"a {type(found).__name__}"
        raise ConfigError(f"{what}: {kind} is not a subclass of titan_core.Trainer; subclass it and replace the "
                          f"methods to change (docs/custom-trainer.md).")
    return found


def trainer_ref(cls: type[Trainer]) -> str:
    """``MODULE:QUALNAME`` of a class passed to ``main(trainer_class=...)``, for the worker processes."""
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        raise ConfigError(f"trainer_class {cls.__qualname__} is defined in the script being run (or inside a "
                          f"function), so worker processes cannot import it; move it into a module of its own "
                          f"and pass it as --trainer MODULE:CLASS.")
    return f"{cls.__module__}:{cls.__qualname__}"


def trainer_for_run(trainer_class: type[Trainer] | None, *, fault_tolerant: bool) -> type[Trainer]:
    """The class a run instantiates: the chosen one, else the Trainer (or, with fault tolerance, its Trainer)."""
    if not fault_tolerant:
        return trainer_class or Trainer
    from ..fault_tolerance.trainer import FaultTolerantTrainer  # optional dependency: torchft

    if trainer_class is None:
        return FaultTolerantTrainer
    if not issubclass(trainer_class, FaultTolerantTrainer):
        raise ConfigError(f"--trainer {trainer_class.__qualname__}: with fault_tolerance.enable the run's trainer "
                          f"must subclass titan_core.fault_tolerance.trainer.FaultTolerantTrainer.")
    return trainer_class


def chosen_trainer(ref: str | None, given: type[Trainer] | None) -> type[Trainer]:
    """The class of ``--trainer``, or of ``main(trainer_class=...)``; not both."""
    if ref is not None and given is not None:
        raise ConfigError(f"--trainer {ref} and main(trainer_class={given.__qualname__}): choose one of them.")
    if ref is not None:
        return load_trainer_class(ref)
    return checked_trainer_class(given, what="main(trainer_class=...)")

