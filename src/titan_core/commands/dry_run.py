"""``--dry-run``: validate, build on the meta device, convert, report, train nothing.

The model and the converters are built by the Trainer's own ``build_model`` and
``apply_converters``, from the same resolved config (device, backend, parallel
degrees, model args), so a dry run refuses exactly what the run would refuse at those
steps; with ``--checkpoint.initial_load`` of a Hugging Face folder the model takes the
shape of its ``config.json``, as in the real run. No process group, data or weights.

The conversion table goes to ``<run_dir>/dry-run/conversion_table.json``, a folder of
its own, so a dry run against the folder of an earlier run never overwrites that run's
``conversion_table.json``, config or checkpoints.
"""

from __future__ import annotations

from pathlib import Path

from ..plan.resolve import ResolvedConfig
from ..trainer import Trainer
from ..weights.shape import shape_source


def dry_run(resolved: ResolvedConfig) -> int:
    c, spec = resolved.config, resolved.spec
    trainer = Trainer(resolved)
    model = trainer.build_model()
    n_params = trainer.n_params  # converters keep the parameters (a module swap shares them)
    print(f"spec {spec.name}, {shape_source(c)}: {n_params:,} parameters ({n_params / 1e9:.3f} B)", flush=True)
    trainer.apply_converters(model)  # prints the conversion table when there are converters
    if trainer.converters:
        path = Path(c.job.run_dir) / "dry-run" / "conversion_table.json"
        trainer.conversion_table.write(path)
        print(f"conversion table written to {path}")
    else:
        print("no converters requested")
    print("dry run: configuration valid; nothing trained")
    return 0
