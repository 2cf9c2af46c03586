"""Pipeline parallelism for Llama: titan-core's stage splitter and schedules over ``model.layers``.

Llama's first stage keeps ``tok_embeddings``, its last ``norm`` and ``output``; the model's
forward skips an end that is None. Everything else (the stage split, the schedules and the
checks on them) is ``titan_core.parallel.pipeline``'s; the names are re-exported here for
the tests and callers that import them from this plugin.
"""

from __future__ import annotations

from titan_core.parallel.pipeline import (
    MULTI_STAGE_SCHEDULES,
    SINGLE_STAGE_SCHEDULES,
    V_SCHEDULES,
    PipelineResult,
    build_stage_module,
    canonical_schedule,
    default_pipelining_fn,
    split_layers,
    stage_ids_of_rank,
    validate_pipeline,
)

pipeline_llama = default_pipelining_fn(blocks_attr="layers", first=("tok_embeddings",), last=("norm", "output"))

__all__ = [
    "MULTI_STAGE_SCHEDULES",
    "SINGLE_STAGE_SCHEDULES",
    "V_SCHEDULES",
    "PipelineResult",
    "build_stage_module",
    "canonical_schedule",
    "pipeline_llama",
    "split_layers",
    "stage_ids_of_rank",
    "validate_pipeline",
]
