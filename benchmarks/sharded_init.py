"""Sharded initialisation: how long one rank of a cluster layout takes to fill its parameters.

One process plays rank R of the layout under torch's fake process group: the model is built on meta,
parallelized, moved to the CPU with ``to_empty`` and filled by ``init_model_weights`` (tiled: the rank
draws only the tiles its shards touch). Timed: that fill. For the old whole-tensor way (every rank
draws every value of its parameters, then cuts its shard) the script times the whole draw of one
block's parameters and of the embedding's first 4096 rows, and extrapolates by value count: the
figure is an estimate, said so in the table.

    python benchmarks/sharded_init.py                                # llama3 70B, FSDP8 x TP8 (64 ranks), rank 0
    python benchmarks/sharded_init.py --flavor 8B --tp 1 --dp-shard 8 --rank 7
"""

from __future__ import annotations

import resource
import time

import torch
from _common import Table, int_parser


def main() -> None:
    parser = int_parser(__doc__, tp=8, dp_shard=8, rank=0, seed=0)
    parser.add_argument("--spec", default="llama3")
    parser.add_argument("--flavor", default="70B")
    args = parser.parse_args()

    from titan_core.models.init import init_model_weights, parameter_generator
    from titan_core.parallel.fake_group import fake_process_group
    from titan_core.plan.resolve import resolve_config
    from titan_core.train.build import build_meta_model, parallelize_part
    from titan_core.train.tp_styles import resolve_tp_styles

    world = args.tp * args.dp_shard
    resolved = resolve_config(config_source=None, world_size=world, override_pairs=[
        ("model.spec", args.spec), ("model.flavor", args.flavor), ("parallelism.tp", str(args.tp)),
        ("parallelism.dp_shard", str(args.dp_shard))])
    started = time.perf_counter()
    meta = build_meta_model(resolved)
    with fake_process_group(rank=args.rank, world_size=world):
        mesh, _ = resolved.dims.build_meshes("cpu")
        model = parallelize_part(resolved, meta.model, mesh=mesh, tp_styles=resolve_tp_styles([]))
        built = time.perf_counter()
        model.to_empty(device="cpu")
        local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
        start = time.perf_counter()
        init_model_weights(model, seed=args.seed)
        tiled = time.perf_counter() - start

    # The old way, sampled: the whole draw of layer 0 and of 4096 embedding rows, per value.
    sample_values, sample_seconds = 0, 0.0
    plain = build_meta_model(resolved).model
    for fqn, param in plain.named_parameters():
        if not fqn.startswith(("layers.0.", "tok_embeddings")):
            continue
        shape = (4096, *param.shape[1:]) if fqn.startswith("tok_embeddings") else tuple(param.shape)
        full = torch.empty(shape)
        start = time.perf_counter()
        plain.init_parameter(fqn, full, parameter_generator(args.seed, fqn))
        sample_seconds += time.perf_counter() - start
        sample_values += full.numel()
    whole = meta.n_params * sample_seconds / sample_values

    table = Table(("figure", "<52"), ("value", ">16"))
    table.print_header()
    table.print_row(f"layout: {args.spec} {args.flavor}, FSDP{args.dp_shard} x TP{args.tp}", f"rank {args.rank}/{world}")
    table.print_row("parameters of the model", f"{meta.n_params / 1e9:.2f} B")
    table.print_row("values this rank holds", f"{local / 1e9:.3f} B")
    table.print_row("meta build + parallelize (s)", f"{built - started:.1f}")
    table.print_row("tiled init, measured (s)", f"{tiled:.1f}")
    table.print_row("whole-tensor init, extrapolated (s)", f"{whole:.0f}")
    table.print_row("tiled / whole", f"{tiled / whole:.4f}")
    table.print_row("peak RSS (GiB)", f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f}")


if __name__ == "__main__":
    main()
