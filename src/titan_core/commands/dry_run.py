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
"""

from __future__ import annotations

from pathlib import Path

from ..console import progress
from ..plan.resolve import ResolvedConfig
from ..runtime.launch_env import rank_env
from ..train import build


def dry_run(resolved: ResolvedConfig) -> int:
    c, spec = resolved.config, resolved.spec
    is_rank0 = rank_env()[0] == 0
    if resolved.model_shape_note:
        progress(resolved.model_shape_note, is_rank0=is_rank0)
    built = build.build_meta_model(resolved)
    build.announce_model(resolved, built.n_params, is_rank0=is_rank0)
    build.check_fits(resolved, built.n_params)
    n_params = built.n_params  # converters keep the parameters (a module swap shares them)
    shape = resolved.weights.shape_source()
    print(f"spec {spec.name}, {shape}: {n_params:,} parameters ({n_params / 1e9:.3f} B)", flush=True)
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
    print("dry run: configuration valid; nothing trained")
    return 0
