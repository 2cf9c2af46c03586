"""``--dry-run``: validate, build on the meta device, convert, report, train nothing.

With ``--checkpoint.initial_load`` of a Hugging Face folder the model takes the shape of
its ``config.json``, and flags that contradict it are refused, exactly as in the real run.

The conversion table goes to ``<run_dir>/dry-run/conversion_table.json``, a folder of
its own, so a dry run against the folder of an earlier run never overwrites that run's
``conversion_table.json``, config or checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..config.resolve import ResolvedConfig
from ..converters import apply_converters
from ..parallel_dims import ParallelDims
from ..protocols import RunContext


def dry_run(resolved: ResolvedConfig) -> int:
    from ..hf.initial_load import initial_model_args, shape_source
    from ..tokenizer import build_tokenizer

    c, spec = resolved.config, resolved.spec
    build_tok = spec.build_tokenizer_fn or (lambda data: build_tokenizer(data.tokenizer))
    tokenizer = build_tok(c.data)
    # As the real run: with an HF initial_load the shape is config.json's, checked against the flags.
    args = initial_model_args(spec, c, tokenizer=tokenizer, world_size=resolved.world_size, is_rank0=True)
    with torch.device("meta"):
        model = spec.model_cls(args)
    p = c.parallelism
    dims = ParallelDims.resolve(dp_replicate=p.dp_replicate, dp_shard=p.dp_shard, tp=p.tp, pp=p.pp,
                                world_size=resolved.world_size)
    device = torch.device("cuda" if torch.cuda.is_available() and c.training.device != "cpu" else "cpu")
    backend = p.backend if p.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    ctx = RunContext(device, backend, c.training, c.parallelism, c.compile)
    converters = [(name, cls(getattr(c, name), parallel_dims=dims, job=ctx)) for name, cls in resolved.converters]
    table = apply_converters(model, converters, spec)
    n_params = sum(t.numel() for t in model.parameters())
    print(f"spec {spec.name}, {shape_source(c)}: {n_params:,} parameters ({n_params / 1e9:.3f} B)")
    if converters:
        print(table.format())
        path = Path(c.job.run_dir) / "dry-run" / "conversion_table.json"
        table.write(path)
        print(f"conversion table written to {path}")
    else:
        print("no converters requested")
    print("dry run: configuration valid; nothing trained")
    return 0
