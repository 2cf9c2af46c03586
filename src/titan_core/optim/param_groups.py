"""Optimizer parameter groups: which parameters get weight decay, and at what LR.

Common practice (GPT-2, Llama, nanoGPT) decays only the matrices of the linear layers:
norm scales and biases are not "weights" a penalty should shrink, and decaying an
embedding table pulls rarely seen tokens toward zero. The built-in split is decided
from the model's structure, not from names, so it holds for any plugin model:

* parameters with fewer than 2 dimensions (every norm scale, every bias);
* the weights of ``nn.Embedding`` modules, and any parameter tied to one (a tie is
  one ``nn.Parameter`` object, so the output head tied to the embedding is the same).

Rules from ``optimizer.param_groups`` come first: each names its parameters with
fnmatch patterns and sets its own weight decay and LR multiplier. The group layout
(names, settings, members) is recorded in every checkpoint: torch's optimizer
``load_state_dict`` would otherwise quietly pair saved state with other parameters,
or restore the saved weight decay over the configured one.
"""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..config.sections import OptimizerSection

DEFAULT, NO_DECAY = "default", "no_decay"
# Wrappers that insert a level into parameter names (torch.compile, activation checkpointing).
_WRAPPER_PARTS = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


@dataclass(frozen=True)
class GroupSetting:
    name: str
    weight_decay: float
    lr_mult: float


def clean_name(name: str) -> str:
    """A parameter name as the model declares it, without wrapper levels."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def _structural_no_decay(module: nn.Module) -> set[int]:
    """ids of the parameters the built-in split keeps out of weight decay."""
    ids = {id(p) for p in module.parameters() if p.ndim < 2}
    for sub in module.modules():
        if isinstance(sub, nn.Embedding):
            ids.update(id(p) for p in sub.parameters(recurse=False))
    return ids


def muon_matrices(module: nn.Module) -> set[int]:
    """ids of the parameters Muon updates (optimizer.name = "Muon"), from the model's structure: the
    2-d weights (and 3-d grouped expert weights) of the hidden-state maps. Left to AdamW: norm scales
    and biases (fewer than 2 dims), embedding tables and weights tied to one, and the output head
    (a linear layer as wide as the vocabulary, i.e. as some embedding table has rows)."""
    vocab_sizes = {sub.num_embeddings for sub in module.modules() if isinstance(sub, nn.Embedding)}
    excluded = _structural_no_decay(module) | {id(p) for p in module.parameters() if p.ndim > 3}
    for sub in module.modules():
        if isinstance(sub, nn.Embedding):
            excluded.update(id(p) for p in sub.parameters(recurse=False))
        elif isinstance(sub, nn.Linear) and sub.out_features in vocab_sizes:
            excluded.update(id(p) for p in sub.parameters(recurse=False))
    return {id(p) for p in module.parameters() if id(p) not in excluded}


def settings(config: OptimizerSection) -> list[GroupSetting]:
    """Every group this config can make, in the order the optimizer holds them."""
    groups = [GroupSetting(DEFAULT, config.weight_decay, 1.0)]
    if config.no_decay_norms_biases_embeddings:
        groups.append(GroupSetting(NO_DECAY, 0.0, 1.0))
    for rule in config.param_groups:
        wd = config.weight_decay if rule.weight_decay is None else rule.weight_decay
        groups.append(GroupSetting(rule.name, wd, rule.lr_mult))
    return groups


def assign(module: nn.Module, config: OptimizerSection) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Group name -> the (clean name, parameter) pairs of ``module`` it holds; trainable parameters only."""
    no_decay = _structural_no_decay(module) if config.no_decay_norms_biases_embeddings else set()
    out: dict[str, list[tuple[str, nn.Parameter]]] = {g.name: [] for g in settings(config)}
    for raw_name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        name = clean_name(raw_name)
        rule = next((r for r in config.param_groups if any(fnmatch.fnmatchcase(name, p) for p in r.patterns)), None)
        group = rule.name if rule is not None else NO_DECAY if id(param) in no_decay else DEFAULT
        out[group].append((name, param))
    return out


def rule_left_empty(module: nn.Module, config: OptimizerSection) -> str | None:
    """Why an ``optimizer.param_groups`` rule takes no parameter of the whole ``module``, in a sentence; None when
    every rule takes some. Such a rule's settings apply to nothing: a misspelt pattern, or one whose parameters an
    earlier rule (first match wins) already took."""
    names = [clean_name(n) for n, p in module.named_parameters() if p.requires_grad]
    taken = {g: [n for n, _ in members] for g, members in assign(module, config).items()}
    for i, rule in enumerate(config.param_groups):
        if taken[rule.name]:
            continue
        matched = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in rule.patterns)]
        head = f"optimizer.param_groups rule {rule.name!r} (patterns {rule.patterns}) takes no parameter"
        if matched:
            earlier = [r.name for r in config.param_groups[:i] if any(n in taken[r.name] for n in matched)]
            return (f"{head}: every parameter it matches ({matched[0]}, ...) is taken first by the earlier rule "
                    f"{earlier[0]!r} (the first rule that matches a parameter takes it). Put the rule before "
                    f"{earlier[0]!r}, narrow that rule's patterns, or remove this one")
        near = difflib.get_close_matches(rule.patterns[0], names, n=3, cutoff=0.5) or names[:3]
        return (f"{head}: none of the model's {len(names)} parameter names matches, so its settings would apply to "
                f"nothing. Names are like {', '.join(near)} (fnmatch: '*' matches any run of characters, dots "
                f"included). Fix the patterns, or remove the rule")
    return None


def torch_groups(module: nn.Module, config: OptimizerSection) -> list[dict[str, Any]]:
    """torch.optim param groups for one model part (empty groups left out); each carries its name and lr_mult.

    With Muon each group is split in two torch groups of the same name: its Muon matrices
    (``use_muon=True``) and the rest; the recorded layout (``layout``) stays by group name."""
    members = assign(module, config)
    groups = []
    for g in settings(config):
        params = [p for _, p in members[g.name]]
        common = {"weight_decay": g.weight_decay, "lr": config.lr * g.lr_mult, "lr_mult": g.lr_mult, "group": g.name}
        if config.name != "Muon":
            groups.append({"params": params, **common})
            continue
        matrices = muon_matrices(module)
        for use_muon in (True, False):
            chosen = [p for p in params if (id(p) in matrices) == use_muon]
            groups.append({"params": chosen, **common, "use_muon": use_muon})
    return [group for group in groups if group["params"]]


def layout(model_parts: list[nn.Module], config: OptimizerSection) -> dict[str, Any]:
    """The group layout of this rank's parts, as recorded in checkpoints (JSON-ready)."""
    out: dict[str, Any] = {}
    for g in settings(config):
        names = sorted(n for part in model_parts for n, _ in assign(part, config)[g.name])
        out[g.name] = {"weight_decay": g.weight_decay, "lr_mult": g.lr_mult, "params": names}
    return out


def merge_layouts(layouts: list[dict[str, Any]]) -> dict[str, Any]:
    """One layout from every rank's (pipeline ranks hold different parameters)."""
    merged: dict[str, Any] = {}
    for one in layouts:
        for name, group in one.items():
            seen = merged.setdefault(name, {**group, "params": []})
            seen["params"] = sorted(set(seen["params"]) | set(group["params"]))
    return merged


def describe_difference(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """What differs between two layouts, in a phrase; None when they are the same."""
    if saved == current:
        return None
    if sorted(saved) != sorted(current):
        return f"groups {sorted(saved)} in the checkpoint but {sorted(current)} now"
    for name in sorted(saved):
        a, b = saved[name], current[name]
        for key in ("weight_decay", "lr_mult"):
            if a[key] != b[key]:
                return f"group {name!r} has {key}={a[key]} in the checkpoint but {b[key]} now"
        moved = sorted(set(a["params"]) ^ set(b["params"]))
        if moved:
            return f"group {name!r} holds other parameters (e.g. {moved[0]!r})"
    return "the groups differ"





def run_layout(model_parts: list[nn.Module], config: OptimizerSection) -> dict[str, Any]:
    """The whole model's group layout; a collective when a process group exists (every rank calls it)."""
    import torch.distributed as dist

    local = layout(model_parts, config)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local
    gathered: list[dict[str, Any] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return merge_layouts([g for g in gathered if g is not None])

__all__ = ["GroupSetting", "assign", "describe_difference", "layout", "merge_layouts", "muon_matrices", "rule_left_empty", "run_layout",
           "settings", "torch_groups"]
