"""Tied weights: parameters a model declares to be one tensor (e.g. embedding and output head).

A model declares its ties with ``tied_weights() -> list[tuple[str, str]]``: pairs
``(source, alias)`` of parameter names, where ``alias`` must be the very same
``nn.Parameter`` object as ``source``. Several set-up steps replace parameter objects
module by module and so silently break a tie:

* ``to_empty`` makes a fresh parameter per module;
* tensor parallelism (``distribute_module``) replaces each module's parameters with DTensors.

The core re-ties after ``to_empty``; a ``parallelize_fn`` that applies tensor parallelism
calls :func:`retie_weights` right after it, before FSDP2 (FSDP2 must see one parameter to
manage it once). The core checks every tie after each set-up step (:func:`check_ties`),
so a broken tie stops the run with the step that broke it instead of training two copies.
Parameter counts dedupe tied parameters (``model.parameters()`` yields each object once).
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from ..errors import ConfigError, PluginError


def declared_ties(model: nn.Module) -> list[tuple[str, str]]:
    """The model's ``(source, alias)`` pairs; ``[]`` for a model that declares none."""
    fn = getattr(model, "tied_weights", None)
    if fn is None:
        return []
    ties = [(str(a), str(b)) for a, b in fn()]
    return ties


def _params_by_name(module: nn.Module) -> dict[str, tuple[nn.Module, str, nn.Parameter]]:
    """fqn -> (owning module, attribute name, parameter), duplicates kept."""
    found: dict[str, tuple[nn.Module, str, nn.Parameter]] = {}
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        for name, param in mod.named_parameters(recurse=False, remove_duplicate=False):
            fqn = f"{mod_name}.{name}" if mod_name else name
            found[fqn] = (mod, name, param)
    return found


def _layout(param: nn.Parameter) -> str:
    """How a parameter is laid out: a plain tensor, or a DTensor's placements on its mesh's dimensions."""
    placements = getattr(param, "placements", None)
    if placements is None:
        return "a plain tensor"
    mesh = getattr(param, "device_mesh", None)
    dims = getattr(mesh, "mesh_dim_names", None)
    return f"a DTensor {tuple(placements)}" + (f" on mesh dimensions {tuple(dims)}" if dims else "")


def retie_weights(module: nn.Module, ties: Iterable[tuple[str, str]] | None = None) -> int:
    """Point each alias at its source's parameter (where ``module`` holds both); returns how many changed.

    ``ties`` defaults to ``module.tied_weights()``. A pipeline stage holding only one side
    of a tie is left alone here (:func:`check_ties` reports it). Two sides laid out differently
    (a tensor-parallel plan that shards one and not the other) are a PluginError: either module
    would run on a weight of the other's layout.
    """
    ties = declared_ties(module) if ties is None else list(ties)
    if not ties:
        return 0
    params = _params_by_name(module)
    changed = 0
    for source, alias in ties:
        if source not in params or alias not in params:
            continue
        src = params[source][2]
        owner, attr, current = params[alias]
        if current is not src:
            if _layout(current) != _layout(src):
                raise PluginError(
                    f"tied weights {source} and {alias} are laid out differently after tensor parallelism: "
                    f"{source} is {_layout(src)}, {alias} is {_layout(current)}. A tie is one tensor, so the "
                    f"tensor-parallel plan must give both modules the same placement (e.g. a vocabulary-sharded "
                    f"embedding, RowwiseParallel(input_layouts=Replicate()), with a column-wise head: both Shard(0) "
                    f"of the [vocab, dim] table), or name neither of them."
                )
            # Not setattr: a module may guard its attributes; _parameters is what named_parameters reads.
            owner._parameters[attr] = src
            changed += 1
    return changed


def check_ties(parts: list[nn.Module], ties: Iterable[tuple[str, str]], *, after: str) -> None:
    """Raise PluginError if a declared tie is not one parameter object after the set-up step ``after``.

    A tie whose two sides are in different parts (pipeline stages) cannot hold: that is
    a ConfigError, naming both parameters.
    """
    ties = list(ties)
    if not ties:
        return
    held = [_params_by_name(part) for part in parts]
    for source, alias in ties:
        src_part = next((i for i, p in enumerate(held) if source in p), None)
        alias_part = next((i for i, p in enumerate(held) if alias in p), None)
        if src_part is None and alias_part is None:
            continue  # a pipeline rank that holds neither side
        if src_part is None or alias_part is None or src_part != alias_part:
            raise ConfigError(
                f"tied weights {source} and {alias} are not in the same model part after {after}: a pipeline "
                f"split cannot keep them one tensor. Put the embedding and the output head in one stage, or "
                f"train this model without pipeline parallelism."
            )
        if held[src_part][source][2] is not held[alias_part][alias][2]:
            raise PluginError(
                f"tied weights {source} and {alias} are two tensors after {after}. The model declares them tied "
                f"(tied_weights()); a parallelize_fn that replaces parameters (tensor parallelism) must call "
                f"titan_core.retie_weights(model) right after doing so and before FSDP2."
            )
