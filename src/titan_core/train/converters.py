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
from ..errors import ConfigError, PluginError, did_you_mean
from ..optim.param_groups import clean_name
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
    on_meta = all(p.device.type == "meta" for p in model.parameters())
    for call in calls:
        name, fqns = call.name, owned[call.name]
        before = {fqn: describe(model.get_submodule(fqn)) for fqn in fqns}
        names_before = [n for n, _ in model.named_parameters()]
        call.convert(model, fqns)
        _refuse_renamed_parameters(name, names_before, [n for n, _ in model.named_parameters()])
        if on_meta:
            _refuse_real_parameters(name, model)
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


def _refuse_renamed_parameters(name: str, before: list[str], after: list[str]) -> None:
    """A converter must keep the model's parameters at their names: the model's ``init_parameter`` picks each first
    value by name (a wrapper level, ``wo.weight`` -> ``wo.inner.weight``, drew another init without a word),
    and checkpoints, the optimizer's groups and Hugging Face export key by them."""
    now = set(after)
    gone = [n for n in before if n not in now]
    if gone:
        leaf = gone[0].rsplit(".", 1)
        owner = leaf[0] + "." if len(leaf) == 2 else ""
        moved = next((n for n in after if n.startswith(owner) and n.endswith("." + leaf[-1]) and n not in before), None)
        where = f" (now {moved}?)" if moved else ""
        raise PluginError(
            f'converter "{name}": {len(gone)} parameter(s) of the model are no longer at their names after convert() '
            f"(e.g. {gone[0]}{where}). The model's init_parameter gives each parameter its first value by its name, "
            f"and checkpoints and the optimizer's groups key by it: keep the converted module's parameters where "
            f"they were (replace the module by a subclass, or register the wrapped module's parameters on the "
            f"wrapper itself).")


def _refuse_real_parameters(name: str, model: nn.Module) -> None:
    """A converter given a meta model that leaves a parameter with real memory: ``to_empty`` then discards it and
    the model's ``init_parameter`` gives it its first value, so the value the converter set was lost without a
    word (``titan-plugin check`` refused it; a run did not)."""
    real = [(fqn, p.device) for fqn, p in model.named_parameters() if p.device.type != "meta"]
    if real:
        fqn, device = real[0]
        raise PluginError(
            f'converter "{name}" left {len(real)} parameter(s) off the meta device after convert() (e.g. {fqn} on '
            f"{device}). The core builds the model on meta and gives it memory afterwards (to_empty), which "
            f"discards such a value, and the model's init_parameter gives every parameter its first value: create "
            f"new parameters on the device of the module they join (device=module.weight.device).")


def check_converted_modules_learn(model_parts: list[nn.Module], table: ConversionTable) -> None:
    """After the first backward: PluginError naming the converter when a parameter of a module it converted
    requires a gradient and got none. A replacement layer that detaches its weight trained nothing in those
    layers, and the run (and ``titan-plugin check``) went on with only the untouched layers learning."""
    owners = {row.module: row.converter for row in table.rows}
    if not owners:
        return
    starved: dict[str, list[str]] = {}
    for part in model_parts:
        for raw_name, param in part.named_parameters():
            if not param.requires_grad or param.grad is not None:
                continue
            name = clean_name(raw_name)
            owner = next((conv for fqn, conv in owners.items() if name.startswith(f"{fqn}.")), None)
            if owner is not None:
                starved.setdefault(owner, []).append(name)
    if starved:
        converter, names = next(iter(starved.items()))  # the first converter's: one message
        raise PluginError(
            f'converter "{converter}": {len(names)} parameter(s) of the modules it converted got no gradient in the '
            f"first step (e.g. {names[0]}), so training would never change them. Its replacement module must use "
            f"its parameters in the autograd graph (not through .detach() or .data, nor under torch.no_grad), or "
            f"set requires_grad=False on those it means to freeze.")


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
