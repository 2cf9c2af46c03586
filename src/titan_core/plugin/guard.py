"""A plugin's method that raises: name the plugin, its distribution and version, and the method.

The core calls plugin code at a few fixed points (a converter's ``select``/``convert``,
a spec's ``parallelize_fn``, the model's ``init_parameter`` and forward). A bare
exception from there reads like a bug in titan-core; this wrapper says whose code
failed and what to do, with the original traceback kept for ``--traceback``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import titan_core

from ..errors import (
    CoreErrorInPluginCall,
    DeadlinePassed,
    PluginError,
    PluginHang,
    PluginOutOfMemory,
    Terminated,
    TitanError,
)
from ..runtime.deadlines import call_deadline
from ..runtime.out_of_memory import is_out_of_memory, out_of_memory_error
from ..runtime.peer_failure import is_collective_failure
from ..runtime.signals import interrupted_by_signal
from . import discovery
from .call_timeout import DEFAULT_PLUGIN_TIMEOUT_S, plugin_timeout, set_plugin_timeout

if TYPE_CHECKING:
    from .discovery import Group

__all__ = ["DEFAULT_PLUGIN_TIMEOUT_S", "accepts_keyword", "call_accepting", "named_by", "plugin_call",
           "plugin_label", "plugin_timeout", "set_plugin_timeout"]

R = TypeVar("R")



def timeout_message(label: str, method: str, seconds: float, *, setting: str = "model.plugin_timeout_s") -> str:
    flag = setting if " " in setting else f"--{setting}"  # a command's own flag is named whole
    return (f"{label} did not return from {method} within {seconds:g} s ({setting}); the plugin hangs "
            f"(waits for something that never comes, or loops). Report it to the plugin's authors; if the call is "
            f"only slow, raise {flag}.")


def plugin_label(group: Group, name: str) -> str:
    """``converter "mx" (titan-mx-prototype 0.1.0)``; in-process registrations say so."""

    kind = "spec" if group == discovery.SPECS else "converter"
    try:
        claims = discovery.discover(group).get(name, [])
    except Exception:  # naming the culprit must never raise itself
        claims = []
    if len(claims) == 1:
        info = claims[0]
        version = f" {info.version}" if info.version and info.version != "-" else ""
        return f'{kind} "{name}" ({info.distribution}{version})'
    return f'{kind} "{name}"'


@contextlib.contextmanager
def plugin_call(group: Group, name: str, method: str, *, timed: bool = True) -> Iterator[None]:
    """Re-raise anything but a TitanError from the block as a PluginError naming the plugin and ``method``;
    with ``timed``, a call that outlives ``model.plugin_timeout_s`` is one such error too."""

    seconds = plugin_timeout()

    def message() -> str:  # built only when needed: naming the plugin reads package metadata
        return timeout_message(plugin_label(group, name), method, seconds)

    try:
        with call_deadline(seconds, f"{method} of {name}", message=message) if timed else contextlib.nullcontext():
            yield
    except DeadlinePassed:
        raise PluginHang(message(), method=method, seconds=seconds) from None
    except (TitanError, GeneratorExit, Terminated):
        raise
    except BaseException as exc:  # SystemExit, a BaseException subclass of its own: still the plugin's
        if is_collective_failure(exc):  # a collective inside the plugin's code lost a peer: not the plugin's fault
            raise
        if is_out_of_memory(exc):  # the run's shape is too big for the device, not a bug in the plugin
            raise out_of_memory_error(exc, where=f"in {method} of {plugin_label(group, name)}",
                                      kind=PluginOutOfMemory) from exc
        if isinstance(exc, KeyboardInterrupt) and interrupted_by_signal():
            raise  # a real Ctrl+C that happened to land in plugin code
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        core = core_origin(exc)
        if core is not None:  # the core's own code raised, called from (or around) the plugin's: say so
            raise CoreErrorInPluginCall(
                f"{core} raised {type(exc).__name__}: {first}, while {plugin_label(group, name)} ran {method}. "
                f"The error comes from titan-core's own code, not from the plugin's: read it as a problem with "
                f"the run's settings or the model's structure, and report it to titan-core if it is neither "
                f"(--traceback shows where it happened)."
            ) from exc
        raise PluginError(
            f"{plugin_label(group, name)} failed in {method}: {type(exc).__name__}: {first}. This is a problem "
            f"in the plugin or in how it is configured, not in your data: check the plugin's settings, update "
            f"it, or report it to its authors (--traceback shows where it failed)."
        ) from exc


def core_origin(exc: BaseException) -> str | None:
    """``titan-core's default_parallelize_fn (parallel/default.py:41)`` when the innermost frame of ``exc``'s
    traceback outside torch and the standard library is titan-core's own code; None when it is the plugin's."""
    import os


    core_dir = os.path.dirname(os.path.abspath(titan_core.__file__)) + os.sep
    # The standard library's own folder (a venv's "platstdlib" would also cover its site-packages).
    skip = [os.path.dirname(os.path.abspath(os.__file__)) + os.sep]
    try:
        import torch

        skip.append(os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
    except ImportError:  # pragma: no cover
        pass
    def machinery(tb: TracebackType, files: tuple[str, ...]) -> bool:
        path = tb.tb_frame.f_code.co_filename
        return path.startswith(core_dir) and os.path.basename(path) in files

    chain = []
    tb = exc.__traceback__
    while tb is not None:
        if not machinery(tb, ("plugin_calls.py", "deadlines.py")):
            chain.append(tb)
        tb = tb.tb_next
    # The facade's frames call the plugin and check what it returned; a block elsewhere that opened
    # plugin_call (chain[0]) does the same: neither is where the core's own code failed.
    frames = [f for f in chain if not machinery(f, ("plugin_boundary.py",))]
    if chain and not machinery(chain[0], ("plugin_boundary.py",)):
        frames = frames[1:]
    for frame in reversed(frames):
        path = os.path.abspath(frame.tb_frame.f_code.co_filename)
        if any(path.startswith(s) for s in skip):
            continue
        if path.startswith(core_dir):
            rel = path[len(core_dir):]
            return f"titan-core's {frame.tb_frame.f_code.co_name} ({rel}:{frame.tb_lineno})"
        return None
    return None


def _parameters(fn: Callable[..., object]) -> list[inspect.Parameter] | None:
    """``fn``'s parameters; None when they cannot be read (a builtin, a C extension): call it with everything."""
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


def accepts_keyword(fn: Callable[..., object], name: str) -> bool:
    params = _parameters(fn)
    return params is None or any(p.kind is p.VAR_KEYWORD or (p.name == name and p.kind is not p.POSITIONAL_ONLY)
                                 for p in params)


def call_accepting(fn: Callable[..., R], *args: object, **kwargs: object) -> R:
    """``fn(*args, **kwargs)`` without the keywords ``fn`` does not take: a plugin written before the core
    offered a keyword (``full_attention``, a new fact in a factory's call) keeps working unchanged."""
    return fn(*args, **{k: v for k, v in kwargs.items() if accepts_keyword(fn, k)})


def named_by(fn: Callable[..., object], added: Mapping[str, object] | None) -> dict[str, object]:
    """The keywords of ``added`` (a later plugin API minor's, docs/plugins.md) that ``fn``'s signature names.
    A ``**kwargs`` catch-all does not count: a wrapper forwarding everything to a function written before
    those keywords existed would pass them on."""
    params = _parameters(fn) or []
    named = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return {k: v for k, v in (added or {}).items() if k in named}


def check_logits(logits: object, inputs: object, *, spec: str, vocab: int | None = None) -> None:
    """The model must return [batch, seq_len, vocab] floating-point logits for [batch, seq_len] inputs: at least
    ``vocab`` wide (every token id a label may hold has a score), and part of the autograd graph when gradients
    are on. Each was a torch error deep in the loss or the backward ("Target 1148 is out of bounds", "element 0
    of tensors does not require grad"), a traceback that named no plugin. ``vocab`` None: the width is not
    checked (the forward returned hidden states for the core's chunked loss)."""
    import torch

    shape = tuple(getattr(logits, "shape", ()))
    expected = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else ()
    who = f"{plugin_label('titan.train_specs', spec)} failed in the model's forward"
    if not isinstance(logits, torch.Tensor) or len(shape) != 3 or shape[:2] != expected:
        got = f"shape {list(shape)}" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise PluginError(
            f"{who}: it returned {got} for inputs of shape {list(expected)}; a model must return logits of shape "
            f"[batch, seq_len, vocab] ({list(expected) + ['vocab']}). Fix the model's forward."
        )
    if not logits.is_floating_point():
        raise PluginError(f"{who}: it returned {str(logits.dtype).removeprefix('torch.')} logits; logits are "
                          f"floating-point scores (the loss takes their softmax). Fix the model's forward.")
    if vocab is not None and shape[2] < vocab:
        raise PluginError(f"{who}: it returned scores for {shape[2]} tokens, but the vocabulary has {vocab} (token "
                          f"ids up to {vocab - 1} are labels); the last dimension of the logits must cover it. Fix "
                          f"the model's output head (its width is the model's vocab_size).")
    if torch.is_grad_enabled() and not logits.requires_grad:
        raise PluginError(f"{who}: it returned logits outside the autograd graph (detached, or computed under "
                          f"torch.no_grad), so no parameter could learn from the loss. Fix the model's forward.")
