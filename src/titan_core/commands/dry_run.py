"""``--dry-run``: validate, build on the meta device, convert, report, train nothing.

The model and the converters are built by the free functions of ``build.py`` that the
Trainer's own set-up calls, from the same resolved config (device, backend, parallel
degrees, starting weights and model args), so a dry run refuses exactly what the run
would refuse at those steps; with ``--checkpoint.initial_load`` of a Hugging Face folder
the model takes the shape of its ``config.json``, as in the real run. No process group,
data or weights.

The conversion table goes to ``<run_dir>/dry-run/conversion_table.json``, a folder of
its own, so a dry run against the folder of an earlier run never overwrites that run's
``conversion_table.json``, config or checkpoints.

A layout of several ranks (``--nproc-per-node M``, with ``--nnodes N`` for N machines) also gets
its memory plan (``train/memory_plan.py``): each pipeline rank is built on meta as that rank
would build it, under torch's fake process group, and its peak is compared with the target
device (``--target-device``; this machine's GPU; or, for a CPU layout on this one machine, its
available memory shared by its ranks). A plan that does not fit is refused (exit 2) with the
settings that would help.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from ..console import progress
from ..errors import ConfigError
from ..plan.resolve import ResolvedConfig
from ..runtime.launch_env import rank_env
from ..train import build
from ..train.activation_probe import ActivationProbe
from ..train.memory_estimate import available_bytes
from ..train.memory_plan import advice, format_plan, make_plan, probe_run
from ..train.target_devices import TargetDevice, parse_target_device


def dry_run(resolved: ResolvedConfig, *, target_device: str | None = None, ranks_per_node: int = 1,
            nnodes: int = 1) -> int:
    c, spec = resolved.config, resolved.spec
    is_rank0 = rank_env()[0] == 0
    target: TargetDevice | None = None
    if target_device is not None and target_device.strip().lower() == "cpu":  # this machine, for CPU layouts
        have = available_bytes(torch.device("cpu"), local_ranks=ranks_per_node)
        target = TargetDevice(f"this machine's available memory over its {ranks_per_node} ranks", have or 0,
                              accelerator=False)
    elif target_device is not None:
        target = parse_target_device(target_device)
    planned = resolved.world_size > 1 or target is not None
    if resolved.model_shape_note:
        progress(resolved.model_shape_note, is_rank0=is_rank0)
    built = build.build_meta_model(resolved)
    build.check_parallelize_settings(resolved, built.model)
    build.announce_model(resolved, built.n_params, is_rank0=is_rank0)
    if not planned:  # this process alone, on this machine: the check the run itself makes
        build.check_fits(resolved, built.n_params)
    n_params = built.n_params  # converters keep the parameters (a module swap shares them)
    shape = resolved.weights.shape_source()
    print(f"spec {spec.name}, {shape}: {n_params:,} parameters ({n_params / 1e9:.3f} B)", flush=True)
    device = (target or plan_device(resolved, ranks_per_node=ranks_per_node, nnodes=nnodes)) if planned else None
    probe = probe_run(resolved, built.model, device=device) if planned else None  # before converters swap modules
    converters = build.build_converters(resolved)
    table = build.convert_model(resolved, built.model, converters)
    if converters:
        if is_rank0:
            print(table.format(), flush=True)
        path = Path(c.job.run_dir) / "dry-run" / "conversion_table.json"
        table.write(path)
        print(f"conversion table written to {path}")
    else:
        print("no converters requested")
    if planned:
        report_plan(resolved, built.model, device, probe)
    print("dry run: configuration valid; nothing trained")
    return 0


def plan_device(resolved: ResolvedConfig, *, ranks_per_node: int, nnodes: int) -> TargetDevice | None:
    """The device a layout without ``--target-device`` runs on, when it is this machine's."""
    if resolved.device.type == "cuda":
        props = torch.cuda.get_device_properties(resolved.device)
        return TargetDevice(f"this machine's {props.name}", int(props.total_memory))
    if nnodes > 1:  # CPU ranks on other machines: their memory is not this one's
        return None
    have = available_bytes(resolved.device, local_ranks=ranks_per_node)
    if have is None:
        return None
    return TargetDevice(f"this machine's available memory over its {ranks_per_node} ranks", have, accelerator=False)


def report_plan(resolved: ResolvedConfig, model: nn.Module, device: TargetDevice | None,
                probe: ActivationProbe | None) -> None:
    """Print the memory plan; ConfigError with what would help when the peak rank does not fit."""
    start = time.perf_counter()
    plan, shapes, probe = make_plan(resolved, model, device=device, probe=probe)
    print(format_plan(plan), flush=True)
    print(f"(planned in {time.perf_counter() - start:.1f} s)", flush=True)
    if plan.fits() is False:
        assert device is not None
        tips = advice(resolved, plan, shapes, probe)
        raise ConfigError(
            f"the planned run does not fit: its peak rank needs {plan.peak.total / 2**30:,.1f} GiB, the "
            f"{device.name} has {device.memory_gib:,.1f} GiB. What would help:\n  " + "\n  ".join(tips)
        )
