"""Llama under FSDP2 / HSDP / replication / TP / PP / activation checkpointing / compile.

Every distributed layout trains the same tiny model on the same global batch in
real gloo processes and must reproduce the single-process losses (SGD, 4
steps) to 1e-5 relative, starting from bit-identical weights. Layouts are
grouped so that one spawn of 2 (and one of 4) processes runs many of them.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest
import torch
from op_counter import CountOps
from parallelize_helpers import parallelize_alone

from titan_core import (
    ConfigError,
    ParallelismSection,
    TrainingSection,
)
from titan_core.parallel import reshard_policy, resolve_ops
from titan_llama.model import Transformer
from titan_llama.parallelize import parallelize_llama, validate_llama_layout
from titan_llama.pipeline import split_layers, stage_ids_of_rank, validate_pipeline

import _parallel_worker as w

L = w.Layout
TWO_RANK = [
    L("fsdp", dict(dp_shard=2)),
    L("fsdp_ac_full", dict(dp_shard=2), dict(mode="full")),
    L("fsdp_ac_selective_ops", dict(dp_shard=2), dict(mode="selective")),
    L("replicate", dict(dp_replicate=2, dp_shard=1)),
    L("tp_loss_parallel", dict(dp_shard=1, tp=2, loss_parallel=True)),
    L("tp_full_logits", dict(dp_shard=1, tp=2, loss_parallel=False)),
    L("pp_1f1b", dict(dp_shard=1, pp=2, pp_schedule="1F1B")),
    L("pp_gpipe", dict(dp_shard=1, pp=2, pp_schedule="GPipe", pp_microbatches=4)),
    L("pp_gpipe_split", dict(dp_shard=1, pp=2, pp_schedule="GPipe", pp_split_points=["layers.1"])),
    L("pp_interleaved_1f1b", dict(dp_shard=1, pp=2, pp_schedule="Interleaved1F1B", pp_stages_per_rank=2)),
    L("pp_zbv", dict(dp_shard=1, pp=2, pp_schedule="ZBVZeroBubble", pp_stages_per_rank=2)),
]
FOUR_RANK = [
    L("hsdp", dict(dp_replicate=2, dp_shard=2)),
    L("fsdp_tp", dict(dp_shard=2, tp=2)),
    L("replicate_tp", dict(dp_replicate=2, dp_shard=1, tp=2)),
    L("pp_fsdp", dict(dp_shard=2, pp=2, pp_schedule="1F1B")),
    L("pp_tp_interleaved", dict(dp_shard=1, tp=2, pp=2, pp_schedule="Interleaved1F1B", pp_stages_per_rank=2)),
]
COMPILE = [L("fsdp_compile_ac_selective", dict(dp_shard=2), dict(mode="selective"), compile=True)]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def reference() -> list[float]:
    return w.run_reference()


@pytest.fixture(scope="module")
def plain_fqns() -> list[str]:
    with torch.device("meta"):
        return sorted(fqn for fqn, _ in Transformer(w.ARGS).named_parameters())


@pytest.fixture(scope="module")
def two_rank_results() -> list[dict[str, Any]]:
    return w.spawn(2, TWO_RANK)


@pytest.fixture(scope="module")
def four_rank_results() -> list[dict[str, Any]]:
    return w.spawn(4, FOUR_RANK)


def _check_layout(name: str, results: list[dict[str, Any]], reference: list[float], plain_fqns: list[str]) -> float:
    """Assert losses, initial weights and parameter names of one layout on every rank; return the max rel diff."""
    worst = 0.0
    fqns: set[str] = set()
    for rank, per_rank in enumerate(results):
        res = per_rank[name]
        assert "error" not in res, f"{name} failed on rank {rank}: {res['error']}"
        assert len(res["losses"]) == len(reference)
        rel = max(abs(a - b) / abs(b) for a, b in zip(res["losses"], reference))
        assert rel < TOLERANCE, f"{name} rank {rank}: losses {res['losses']} vs single-process {reference}"
        worst = max(worst, rel)
        assert res["n_checked"] > 0
        assert res["init_diff"] == 0.0, f"{name} rank {rank}: initial weights differ by {res['init_diff']}"
        assert set(res["fqns"]) <= set(plain_fqns), f"{name}: parameter names changed: {res['fqns']}"
        fqns |= set(res["fqns"])
    # Together the ranks hold every parameter, under its plain-model name.
    assert sorted(fqns) == plain_fqns
    return worst


def test_reference_learns(reference: list[float]) -> None:
    # Guards the comparisons below: a reference that does not move would match anything.
    assert reference[-1] < reference[0] - 1.0


@pytest.mark.parametrize("name", [layout.name for layout in TWO_RANK])
def test_two_process_layout_matches_single_process(
    name: str, two_rank_results: list[dict[str, Any]], reference: list[float], plain_fqns: list[str]
) -> None:
    _check_layout(name, two_rank_results, reference, plain_fqns)


@pytest.mark.parametrize("name", [layout.name for layout in FOUR_RANK])
def test_four_process_layout_matches_single_process(
    name: str, four_rank_results: list[dict[str, Any]], reference: list[float], plain_fqns: list[str]
) -> None:
    _check_layout(name, four_rank_results, reference, plain_fqns)


def test_layouts_really_distribute(two_rank_results: list[dict[str, Any]], four_rank_results: list[dict[str, Any]]) -> None:
    # Parameters become DTensors wherever FSDP2, replication or TP applies; a
    # pipeline alone keeps plain tensors, but each rank holds only its stages.
    for name, res in two_rank_results[0].items():
        assert res["dtensor"] == (not name.startswith("pp")), name
    n_params = len(two_rank_results[0]["fsdp"]["fqns"])
    for rank in range(2):
        assert len(two_rank_results[rank]["pp_1f1b"]["fqns"]) < n_params
    assert two_rank_results[0]["pp_zbv"]["stage_ids"] == [0, 3]
    assert two_rank_results[1]["pp_interleaved_1f1b"]["stage_ids"] == [1, 3]
    assert two_rank_results[0]["pp_gpipe_split"]["fqns"] == sorted(
        f for f in two_rank_results[0]["fsdp"]["fqns"] if f.startswith(("tok_embeddings", "layers.0."))
    )
    assert two_rank_results[0]["fsdp_ac_full"]["checkpointed"] == 4
    assert four_rank_results[0]["pp_fsdp"]["dtensor"]


@pytest.mark.slow
def test_compile_with_fsdp_and_selective_checkpointing(reference: list[float], plain_fqns: list[str]) -> None:
    results = w.spawn(2, COMPILE)
    _check_layout(COMPILE[0].name, results, reference, plain_fqns)
    assert results[0][COMPILE[0].name]["compiled"] == 4


# ---------------------------------------------------------------- activation checkpointing (one process)


def _backward_op_counts(ac: dict[str, Any]) -> Counter[str]:
    """Ops run during backward of one step (recomputation shows up here)."""
    with torch.device("meta"):
        # the fused kernel asked for by name: "auto" leaves plain causal attention to SDPA on CPUs without AVX-512
        model = Transformer(dataclasses.replace(w.ARGS, attention_kernel="fused"))
    parallelize_alone(parallelize_llama, model, parallelism=ParallelismSection(dp_shard=1), **ac)
    model.to_empty(device="cpu")
    w.init_model_weights([model], seed=w.SEED)
    tokens, labels = w.batch()
    loss = w.loss_fn(model(tokens), labels)
    with CountOps() as counter:
        loss.backward()
    return counter.counts


SDPA_CPU = "aten._scaled_dot_product_flash_attention_for_cpu.default"
# The op the model's attention runs here (float32 CPU, 16-channel heads, attention_kernel="fused").
ATTENTION = "titan_llama.causal_attention.default"
MM = "aten.mm.default"


@pytest.mark.parametrize(
    "ac",
    [dict(mode="full"), dict(mode="selective", selective_every=2), dict(mode="selective"),
     dict(mode="selective", selective_save_ops=[MM, SDPA_CPU])],
    ids=["full", "every-2nd-block", "per-op-default", "per-op-save-attention"],
)
def test_activation_checkpointing_keeps_losses(ac: dict[str, Any], reference: list[float]) -> None:
    losses = w.run_reference(ac)
    assert max(abs(a - b) / abs(b) for a, b in zip(losses, reference)) < 1e-6


def test_activation_checkpointing_recomputes_what_the_mode_says() -> None:
    none = _backward_op_counts({})
    full = _backward_op_counts(dict(mode="full"))
    every2 = _backward_op_counts(dict(mode="selective", selective_every=2))
    per_op = _backward_op_counts(dict(mode="selective", selective_save_ops=[MM]))
    save_attn = _backward_op_counts(dict(mode="selective", selective_save_ops=[MM, SDPA_CPU]))
    default = _backward_op_counts(dict(mode="selective"))  # the default list saves attention on CPU too
    recomputed = {name: c[MM] - none[MM] for name, c in
                  [("full", full), ("every2", every2), ("per_op", per_op), ("save_attn", save_attn)]}
    # Without checkpointing backward runs no forward attention; full reruns it in every block.
    assert none[ATTENTION] == 0 and full[ATTENTION] == w.ARGS.n_layers
    # Every 2nd block: half the blocks recompute.
    assert every2[ATTENTION] == w.ARGS.n_layers // 2 and recomputed["every2"] * 2 == recomputed["full"]
    # Per-op: every block reruns, but half of its matmuls come from the saved outputs.
    assert recomputed["per_op"] * 2 == recomputed["full"] and per_op[ATTENTION] == w.ARGS.n_layers
    # Saving the (CPU) attention op removes it from the recomputation.
    assert save_attn[ATTENTION] == 0 and recomputed["save_attn"] == recomputed["per_op"]
    assert default[ATTENTION] == 0 and default[MM] == save_attn[MM]
    # Naming the fused op itself works the same as naming the SDPA kernel.
    save_fused = _backward_op_counts(dict(mode="selective", selective_save_ops=[MM, ATTENTION]))
    assert save_fused[ATTENTION] == 0 and save_fused[MM] == save_attn[MM]


def test_activation_checkpointing_rejects_unknown_ops() -> None:
    with pytest.raises(ConfigError, match='"aten.not_an_op.default" is not an operator overload'):
        resolve_ops(["aten.mm.default", "aten.not_an_op.default"])


# ---------------------------------------------------------------- layout validation


def _validate(world_size: int, *, args: Any = None, seq_len: int = 32, local_batch_size: int = 4, **parallelism: Any) -> None:
    validate_llama_layout(
        args or w.ARGS, parallelism=ParallelismSection(**parallelism),
        training=TrainingSection(seq_len=seq_len, local_batch_size=local_batch_size), world_size=world_size,
    )


def test_valid_layouts_pass() -> None:
    _validate(8, tp=2, pp=2)
    _validate(4, pp=2, pp_schedule="interleaved1f1b", pp_stages_per_rank=2)
    _validate(2, pp=2, pp_split_points=["layers.3"])


@pytest.mark.parametrize(
    ("world", "kwargs", "message"),
    [
        (8, dict(tp=8), "parallelism.tp=8 does not divide model n_heads=4"),
        (4, dict(tp=4), "parallelism.tp=4 does not divide model n_kv_heads=2"),
        (2, dict(tp=2, seq_len=31), r"does not divide training.seq_len \(sequence parallelism"),
        (8, dict(pp=8), "more stages than the model has layers: pp=8 x pp_stages_per_rank=1 = 8 stages, n_layers=4"),
        (4, dict(pp=2, pp_schedule="Interleaved1F1B", pp_stages_per_rank=4), "8 stages, n_layers=4"),
        (2, dict(pp=2, pp_schedule="1F1C"), 'unknown pipeline schedule "1F1C". Valid schedules: 1F1B, GPipe, Interleaved1F1B'),
        (2, dict(pp=2, pp_stages_per_rank=2), "pp_schedule=1F1B runs one stage per rank, but pp_stages_per_rank=2"),
        (2, dict(pp=2, pp_schedule="Interleaved1F1B"), "runs several stages per rank, but pp_stages_per_rank=1"),
        (2, dict(pp=2, pp_split_points=["layers.1", "layers.2"]), "has 2 entries but 2 stages need 1"),
        (2, dict(pp=2, pp_split_points=["layers.4"]), '"layers.4" is not a layer that can start a stage'),
        (2, dict(pp=2, pp_split_points=["layer.2"]), '"layer.2" is not a layer'),
    ],
)
def test_invalid_layouts_are_config_errors(world: int, kwargs: dict[str, Any], message: str) -> None:
    training = {k: kwargs.pop(k) for k in ("seq_len", "local_batch_size") if k in kwargs}
    with pytest.raises(ConfigError, match=message):
        _validate(world, **training, **kwargs)


def test_tp_checks_the_mlp_width() -> None:
    args = dataclasses.replace(w.ARGS, multiple_of=1, ffn_dim_multiplier=1.01)
    assert args.ffn_hidden_dim == 171
    with pytest.raises(ConfigError, match="MLP hidden size"):
        _validate(2, args=args, tp=2)


def test_split_points_and_stage_assignment() -> None:
    assert split_layers(4, 2, []) == [["0", "1"], ["2", "3"]]
    assert split_layers(5, 2, []) == [["0", "1", "2"], ["3", "4"]]
    assert split_layers(4, 4, []) == [["0"], ["1"], ["2"], ["3"]]
    assert split_layers(4, 2, ["layers.3"]) == [["0", "1", "2"], ["3"]]
    with pytest.raises(ConfigError, match="increasing"):
        split_layers(6, 3, ["layers.3", "layers.2"])
    assert stage_ids_of_rank(0, 2, 2, v_style=False) == [0, 2]
    assert stage_ids_of_rank(1, 4, 2, v_style=True) == [1, 6]
    assert stage_ids_of_rank(0, 2, 1, v_style=False) == [0]


def test_pipeline_validation_is_case_insensitive() -> None:
    validate_pipeline(ParallelismSection(pp=2, pp_schedule="gpipe"), TrainingSection(local_batch_size=2), n_layers=2)


def test_reshard_policy() -> None:
    assert [reshard_policy("default", is_last_block=last, pp_enabled=False) for last in (False, True)] == [True, False]
    assert reshard_policy("default", is_last_block=False, pp_enabled=True) is False
    assert reshard_policy("always", is_last_block=True, pp_enabled=True) is True
    assert reshard_policy("never", is_last_block=False, pp_enabled=False) is False
