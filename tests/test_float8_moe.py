"""titan-float8 on MoE experts (float8.moe_fqns): the emulated float8 rowwise grouped GEMM against a
per-expert reference and fp32, training a Qwen3-MoE cut, float8 and mx together, selection errors."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from titan_core.config.parallel_dims import ParallelDims
from titan_core.train.converters import apply_converters
from titan_float8 import Float8Config, Float8Converter
from titan_float8.experts import EmulatedFloat8ExpertWeight
from titan_float8.grouped_mm import emulated_float8_grouped_mm, grouped_mm_float32
from titan_mx_prototype import MXConfig, MXConverter

from conftest import assert_user_error, titan
from converter_helpers import job, moe_losses_with_and_without, qwen3_moe_on_meta

torch.set_num_threads(1)
DIMS = ParallelDims(1, 1, 1, 1, 1)
ATTENTION = [f"layers.{i}.attention.w{j}" for i in range(2) for j in "qkvo"]
DENSE_FFN = [f"layers.0.feed_forward.w{j}" for j in (1, 2, 3)]
EXPERTS = "layers.1.moe.experts"


def float8(**config: object) -> Float8Converter:
    return Float8Converter(Float8Config(**config), parallel_dims=DIMS, job=job())


def mx(**config: object) -> MXConverter:
    return MXConverter(MXConfig(**config), parallel_dims=DIMS, job=job())


def q(t: torch.Tensor, dim: int) -> torch.Tensor:
    """The recipe's quantization written out plainly: e4m3 with a power-of-two scale per slice along dim."""
    amax = t.abs().amax(dim=dim, keepdim=True).double().clamp(min=1e-12)
    scale = torch.exp2(torch.floor(torch.log2((448.0 / amax).float())))
    return (t * scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() / scale


def per_expert_reference(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, counts: list[int]):
    """(out, grad_x, grad_w) expert by expert with plain matmuls: x [tokens, K], w [E, N, K], g [tokens, N]."""
    outs, gxs, gws = [], [], []
    for e, (xe, ge) in enumerate(zip(torch.split(x, counts), torch.split(g, counts))):
        outs.append(q(xe, 1) @ q(w[e], 1).T)  # tokens per row, weight per output column
        gxs.append(q(ge, 1) @ q(w[e], 0))  # grad_out per row, weight per input column
        gws.append(q(ge, 0).T @ q(xe, 0) if counts[e] else torch.zeros_like(w[e]))  # per column of the group
    return torch.cat(outs), torch.cat(gxs), torch.stack(gws)


def test_emulated_grouped_gemm_matches_the_per_expert_reference_and_is_near_fp32() -> None:
    torch.manual_seed(0)
    counts = [10, 0, 17, 13]  # an expert without tokens included
    tokens, k, n = sum(counts), 32, 48
    # rows of very different magnitudes: one scale per tensor would lose the small rows
    x = (torch.randn(tokens, k) * torch.logspace(-3, 2, tokens)[:, None]).requires_grad_()
    w = torch.randn(len(counts), n, k, requires_grad=True)
    g = torch.randn(tokens, n)
    offs = torch.cumsum(torch.tensor(counts), 0, dtype=torch.int32)

    out = emulated_float8_grouped_mm(x, w.transpose(-2, -1), offs)
    grad_x, grad_w = torch.autograd.grad(out, (x, w), g)
    ref = per_expert_reference(x.detach(), w.detach(), g, counts)
    fp32 = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
    fp32_grads = torch.autograd.grad(fp32, (x, w), g)
    for name, ours, theirs, exact in zip(("out", "grad_x", "grad_w"), (out, grad_x, grad_w), ref,
                                         (fp32, *fp32_grads)):
        assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-6 * theirs.abs().max().item()), name
        rel = ((ours - exact).norm() / exact.norm()).item()
        assert 0.005 < rel < 0.08, (name, rel)  # float8 rounding: really applied, and only that
    # The per-expert float32 path (devices without a float32 grouped GEMM) gives the same bits.
    for a, b in ((x, w.transpose(-2, -1)), (g.t(), x)):
        assert torch.equal(grouped_mm_float32(a, b, offs, per_expert=True), grouped_mm_float32(a, b, offs))


def test_experts_are_opt_in_and_filter_fqns_applies() -> None:
    model = qwen3_moe_on_meta()
    assert EXPERTS not in float8().select(model)
    assert float8(moe_fqns=["experts"]).select(model)[-1] == EXPERTS
    assert EXPERTS not in float8(moe_fqns=["experts"], filter_fqns=["output", "moe"]).select(model)
    assert "moe_fqns" in float8().selection_keys()


def test_moe_experts_run_float8_grouped_gemms_and_train_close_to_fp32() -> None:
    converted = qwen3_moe_on_meta()
    table = apply_converters(converted, [("float8", float8(moe_fqns=["experts"]))], spec=None)
    rows = {row.module: row.after for row in table.rows}
    assert rows[EXPERTS] == "GroupedExperts(w1,w2,w3=EmulatedFloat8ExpertWeight)"
    assert {f for f, after in rows.items() if after == "Float8Linear"} >= set(ATTENTION + DENSE_FFN)
    experts = converted.get_submodule(EXPERTS)
    assert all(isinstance(w.data, EmulatedFloat8ExpertWeight) for w in (experts.w1, experts.w2, experts.w3))

    # Training: float8 on the experts (plus one attention linear: float8 needs a linear or the experts);
    # the dense float8 linears (tensorwise) are the float8 tests' subject, and their rounding
    # (measured 0.06 off fp32 at step 3 of this run) would hide the experts' (measured 0.008).
    converted = qwen3_moe_on_meta()
    apply_converters(converted, [("float8", float8(fqns=["layers.0.attention.wq"], moe_fqns=["experts"]))], spec=None)
    low, ref = moe_losses_with_and_without(converted, steps=5)
    assert all(math.isfinite(v) for v in low) and low[-1] < low[0] - 1.0
    assert low != ref  # float8 really changes the numbers
    assert max(abs(a - b) for a, b in zip(low, ref)) < 0.05, (low, ref)
    experts = converted.get_submodule(EXPERTS)
    assert isinstance(experts.w2.data, EmulatedFloat8ExpertWeight)  # still float8 after AdamW's in-place updates
    assert experts.w2.grad is not None and experts.w2.grad.abs().sum() > 0


def test_float8_and_mx_on_a_moe_model_each_take_their_own_modules() -> None:
    model = qwen3_moe_on_meta()
    table = apply_converters(model, [("float8", float8(moe_fqns=["experts"])), ("mx", mx())], spec=None)
    owner = {row.module: row.converter for row in table.rows}
    assert {f for f, c in owner.items() if c == "mx"} == set(DENSE_FFN)
    assert {f for f, c in owner.items() if c == "float8"} >= {EXPERTS, *ATTENTION}
    # both ask for the experts: the later one (mx) takes them, float8 keeps its linears
    model = qwen3_moe_on_meta()
    table = apply_converters(model, [("float8", float8(moe_fqns=["experts"])), ("mx", mx(moe_fqns=["experts"]))],
                             spec=None)
    owner = {row.module: row.converter for row in table.rows}
    assert owner[EXPERTS] == "mx" and owner["layers.0.attention.wq"] == "float8"


def test_float8_left_nothing_by_mx_on_a_moe_model_is_one_message(cli, tmp_path) -> None:
    # float8 asks for the dense feed-forward and the experts, mx (named later) takes both.
    result = cli("--spec", "qwen3", "--flavor", "debugmoe", "--qwen3.n_layers=2", "--qwen3.mlp_only_layers=[0]",
                 "--converters", "float8,mx", '--float8.fqns=["feed_forward"]', "--float8.moe_fqns=experts",
                 "--mx.moe_fqns=experts", "--dry-run", f"--job.run_dir={tmp_path}")
    assert_user_error(result, 'converter "float8" was requested but has no module left', 'taken by "mx"',
                      "float8.moe_fqns", "mx.moe_fqns")
    assert result.text.count("has no module left") == 1


def test_moe_fqns_that_match_no_experts_exits_2(cli, tmp_path) -> None:
    result = cli("--spec", "qwen3", "--flavor", "debugmoe", "--converters", "float8", "--float8.moe_fqns=expert",
                 "--training.steps=1", "--training.seq_len=32", f"--job.run_dir={tmp_path}")
    assert_user_error(result, "float8.moe_fqns entries ['expert'] match no GroupedExperts", "Fix float8.moe_fqns")
    assert result.text.count("float8.moe_fqns entries") == 1


# debugmoe cut to 2 MoE layers, 32-token rows, 4 rows per step in all (as tests/test_expert_parallel.py).
MOE = ("--spec", "qwen3", "--flavor", "debugmoe", "--qwen3.n_layers=2", "--training.seq_len=32",
       "--training.steps=4", "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=1", "--training.seed=0",
       "--metrics.report=false")
# float8 on the experts only: the dense float8 linears' tensorwise scales depend on each rank's rows,
# the experts' rowwise scales (per token row, per expert column, per expert group) do not.
EXPERTS_ONLY = ("--converters", "float8", "--float8.moe_fqns=experts", '--float8.filter_fqns=["output","attention"]')


def test_float8_experts_train_near_fp32_through_the_cli_and_compose_with_ep2(tmp_path: Path) -> None:
    runs = {"fp32": (*MOE, "--training.local_batch_size=4"),
            "float8": (*MOE, *EXPERTS_ONLY, "--training.local_batch_size=4")}
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(runs, pool.map(lambda name: titan(tmp_path / name, *runs[name]), runs)))
    done["ep2"] = titan(tmp_path / "ep2", *MOE, *EXPERTS_ONLY, "--parallelism.ep=2", "--training.local_batch_size=2",
                        nproc=2)
    losses = {}
    for name, run in done.items():
        assert run.code == 0 and "Traceback" not in run.text, f"{name}:\n{run.text}"
        losses[name] = [r["loss"] for r in run.records()]
        assert len(losses[name]) == 4, name
    table = json.loads((tmp_path / "float8" / "conversion_table.json").read_text())
    assert {(row["module"], row["after"]) for row in table} == {
        (f"layers.{i}.moe.experts", "GroupedExperts(w1,w2,w3=EmulatedFloat8ExpertWeight)") for i in range(2)}
    fp32, low, ep2 = losses["fp32"], losses["float8"], losses["ep2"]
    # float8 is applied (measured 1.1e-4 off fp32 at step 1, since qwen3's untied embedding starts at
    # unit scale; fp32 runs repeat bit for bit) and trains as fp32 does (measured: falls 0.23 in 4 steps,
    # at most 8.4e-4 off fp32).
    assert abs(low[0] - fp32[0]) > 2e-5 and low[-1] < low[0] - 0.15
    assert max(abs(a - b) for a, b in zip(low, fp32)) < 0.05, (low, fp32)
    # EP 2: every scale sees the same values, so the first steps equal one process (measured 1.2e-7 relative);
    # later, float32 reduction-order differences flip float8 roundings and the runs drift apart slowly
    # (measured 3e-4 relative at step 4).
    for a, b in zip(ep2[:2], low[:2]):
        assert abs(a - b) <= 1e-6 * abs(b), (ep2, low)
    assert max(abs(a - b) for a, b in zip(ep2, low)) < 0.01, (ep2, low)


def test_experts_use_torchao_kernels_from_sm90_and_emulate_below(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which path a GPU would take (the real-kernel path itself is untested: no GPU in CI)."""
    from torchao.prototype.moe_training.tensor import Float8TrainingWeightWrapperTensor

    from titan_float8 import hardware
    from titan_float8.experts import expert_weight_class, experts_emulate

    cuda = torch.device("cuda")
    monkeypatch.setattr(hardware, "cuda_capability", lambda device: (8, 9))
    assert experts_emulate(False, cuda) == (True, "experts emulated: torch._scaled_grouped_mm needs sm_90+, "
                                                  "this GPU is sm_89")
    monkeypatch.setattr(hardware, "cuda_capability", lambda device: (9, 0))
    assert experts_emulate(False, cuda)[0] is False
    assert experts_emulate(True, cuda)[0] is True  # float8.emulate=true emulates the experts too
    assert expert_weight_class(False) is Float8TrainingWeightWrapperTensor
    assert expert_weight_class(True) is EmulatedFloat8ExpertWeight
