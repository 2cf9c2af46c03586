"""The converter pipeline: select -> resolve overlaps -> convert, and optimizer hooks.

Converters run on the meta-device model before any parallelism. Each module
belongs to at most one converter; where selections overlap, the converter named
later on the command line wins, as later flags override earlier ones. The
result is a ``ConversionTable`` (module -> converter, type before -> after) that
the trainer prints and writes to the run folder.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..boundary.plugin_boundary import ConverterCalls, converter_calls
from ..errors import ConfigError, did_you_mean
from ..plugin.protocols import ModelConverter, TrainSpec

logger = logging.getLogger(__name__)

__all__ = [
    "ConversionRow",
    "ConversionTable",
    "OptimizerHooks",
    "apply_converters",
    "register_converter_hooks",
]


@dataclass(frozen=True)
class ConversionRow:
    """One converted module: its fully qualified name, who converted it, its type before and after."""

    module: str
    converter: str
    before: str
    after: str


@dataclass
class ConversionTable:
    """All converted modules of a model, in conversion order."""

    rows: list[ConversionRow] = field(default_factory=list)

    def modules_of(self, converter: str) -> list[str]:
        """The fqns a converter converted."""
        return [row.module for row in self.rows if row.converter == converter]

    def format(self) -> str:
        """An aligned plain-text table, or a one-line note when nothing was converted."""
        if not self.rows:
            return "no modules converted"
        header = ("module", "converter", "before", "after")
        cells = [header] + [(r.module, r.converter, r.before, r.after) for r in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

        def line(row: Sequence[str]) -> str:
            return "  ".join(text.ljust(width) for text, width in zip(row, widths)).rstrip()

        rule = "  ".join("-" * width for width in widths)
        return "\n".join([line(header), rule, *(line(row) for row in cells[1:])])

    def summary(self) -> str:
        """One line: how many modules each converter converted, from which type to which."""
        if not self.rows:
            return "no modules converted"
        by: dict[tuple[str, str, str], int] = {}
        for r in self.rows:
            by[(r.converter, r.before, r.after)] = by.get((r.converter, r.before, r.after), 0) + 1
        parts = "; ".join(f"{conv}: {n} {before} -> {after}" for (conv, before, after), n in by.items())
        return f"converted {len(self.rows)} module{'s' if len(self.rows) > 1 else ''} ({parts})"

    def to_json(self) -> str:
        """The rows as a JSON list of objects (keys: module, converter, before, after)."""
        return json.dumps([asdict(row) for row in self.rows], indent=2)

    def write(self, path: str | Path) -> None:
        """Write ``to_json()`` to ``path``, creating its folder."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")


def describe(module: nn.Module) -> str:
    """The module's class name, plus its weight's tensor subclass when it is not a plain tensor.

    Some rewrites keep the module class and swap only the weight's tensor type,
    so the table would otherwise show no change for them.
    """
    name = type(module).__name__
    # Its own parameters: "weight" for a linear, the stacked w1/w2/w3 of MoE experts.
    wrapped = {pname: type(p.data).__name__ for pname, p in module.named_parameters(recurse=False)
               if type(p.data) not in (torch.Tensor, nn.Parameter)}
    if not wrapped:
        return name
    kinds = set(wrapped.values())
    if len(kinds) == 1:
        return f"{name}({','.join(wrapped)}={kinds.pop()})"
    return f"{name}({', '.join(f'{k}={v}' for k, v in wrapped.items())})"


def apply_converters(
    model: nn.Module,
    converters: list[tuple[str, ModelConverter[Any]]],
    spec: TrainSpec | None,
) -> ConversionTable:
    """Select, resolve overlaps (later wins) and convert, in command-line order.

    ``converters`` pairs each converter with its name (its config section).
    Raises ``ConfigError`` when a converter selects a module the model lacks or
    ends up with no module at all.
    """
    names = [name for name, _ in converters]  # distinct: model.converters refuses a name listed twice
    calls = converter_calls(converters)
    if spec is not None:
        for call in calls:
            call.compatible_with(spec)

    modules = dict(model.named_modules())
    selections: dict[str, list[str]] = {}
    for call in calls:
        selected = call.select(model)
        _check_exist(call.name, selected, modules)
        selections[call.name] = selected

    owner: dict[str, str] = {}
    for name in names:
        for fqn in selections[name]:
            owner[fqn] = name  # a later converter overwrites an earlier claim
    owned = {name: [fqn for fqn in selections[name] if owner[fqn] == name] for name in names}

    by_name = {call.name: call for call in calls}
    for name in names:
        if not owned[name]:
            raise ConfigError(_empty_message(name, by_name, selections[name], owner, names))

    table = ConversionTable()
    for call in calls:
        name, fqns = call.name, owned[call.name]
        before = {fqn: describe(model.get_submodule(fqn)) for fqn in fqns}
        call.convert(model, fqns)
        for fqn in fqns:
            try:
                after = describe(model.get_submodule(fqn))
            except AttributeError as exc:
                raise ConfigError(
                    f'converter "{name}" removed module "{fqn}" instead of rewriting it in place; '
                    "a converter must keep every module it was given at its name"
                ) from exc
            table.rows.append(ConversionRow(fqn, name, before[fqn], after))
    for name in names:
        logger.info("converter %s: %d modules", name, len(owned[name]))
    return table


def _check_exist(name: str, selected: list[str], modules: dict[str, nn.Module]) -> None:
    missing = [fqn for fqn in selected if fqn not in modules or fqn == ""]
    if not missing:
        return
    hints = "".join(did_you_mean(fqn, [m for m in modules if m]) for fqn in missing[:3])
    raise ConfigError(
        f'converter "{name}" selected {len(missing)} module(s) that the model does not have: '
        f"{', '.join(repr(m) for m in missing[:5])}{' ...' if len(missing) > 5 else ''}.{hints} "
        f"Selections name submodules by their fully qualified name as in model.named_modules(); "
        f"fix the converter's selection settings."
    )


def _qualified_keys(name: str, converter: ConverterCalls) -> list[str]:
    # Converters may return bare field names of their Config; the section is their name.
    return [key if key.startswith(f"{name}.") else f"{name}.{key}" for key in converter.selection_keys()]


def _empty_message(
    name: str,
    by_name: dict[str, ConverterCalls],
    selected: list[str],
    owner: dict[str, str],
    order: list[str],
) -> str:
    keys = _qualified_keys(name, by_name[name])
    key_text = " / ".join(keys) if keys else "its settings"
    if not selected:
        return (
            f'converter "{name}" was requested but selected no module of this model. '
            f"Change {key_text} so that it selects some modules, or remove \"{name}\" from model.converters."
        )
    winners = [n for n in order if n != name and any(owner[fqn] == n for fqn in selected)]
    winner_text = ", ".join(f'"{w}"' for w in winners)
    winner_keys = [k for w in winners for k in _qualified_keys(w, by_name[w])]
    also = f" (or {' / '.join(winner_keys)})" if winner_keys else ""
    examples = ", ".join(selected[:3]) + (" ..." if len(selected) > 3 else "")
    return (
        f'converter "{name}" was requested but has no module left: all {len(selected)} modules it selected '
        f"({examples}) were taken by {winner_text}, named later in model.converters (the later converter wins "
        f"on overlap). Set {key_text}{also} so that the selections differ, or drop one of the converters."
    )


@dataclass
class OptimizerHooks:
    """The hooks registered for converters; ``remove()`` unregisters them all."""

    handles: list[RemovableHandle] = field(default_factory=list)
    registered: list[str] = field(default_factory=list)  # "<ConverterClass>.<hook name>"

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self.registered.clear()


def register_converter_hooks(
    optimizer: torch.optim.Optimizer,
    converters: Sequence[tuple[str, ModelConverter[Any]] | ModelConverter[Any]],
    model_parts: list[nn.Module],
) -> OptimizerHooks:
    """Register each converter's overridden pre/post optimizer hooks on ``optimizer``.

    Each hook runs once per ``optimizer.step()`` with ``model_parts``, guarded as every plugin call
    is. Hooks a converter does not override are not registered. ``converters`` pairs each with its
    name (a bare converter is named by its class).
    """
    hooks = OptimizerHooks()
    for call in converter_calls(converters):
        for hook, register in (("pre_optimizer_hook", optimizer.register_step_pre_hook),
                               ("post_optimizer_hook", optimizer.register_step_post_hook)):
            step_hook = call.optimizer_hook(hook, model_parts)
            if step_hook is not None:
                hooks.handles.append(register(step_hook))
                hooks.registered.append(f"{type(call.converter).__name__}.{hook}")
    return hooks
