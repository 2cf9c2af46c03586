"""The dry run's memory plan: a cluster layout planned from this machine, on meta, under the fake
process group (train/memory_plan.py, train/activation_probe.py, parallel/fake_group.py)."""

from __future__ import annotations

import os
import re

import pytest
import torch

from titan_core.errors import ConfigError
from titan_core.train.target_devices import GIB, parse_target_device

from conftest import assert_user_error


def test_target_devices_by_name_or_size() -> None:
    assert parse_target_device("h100").memory_bytes == int(79.1 * GIB)
    assert parse_target_device("H100-80GB").name == "H100"
    assert parse_target_device("80GiB").memory_bytes == 80 * GIB
    assert parse_target_device("141GB").memory_bytes == 141 * 10**9
    with pytest.raises(ConfigError, match='"V100" is not a known device. Known: A100-40GB'):
        parse_target_device("V100")
    # sizes a typo made: refused as sizes (before: "-5GiB" and "1e400GiB" were unknown device names, and
    # 99999999999999999999999GiB a device the plan said everything fits on)
    for text in ("-5GiB", "0GiB", "-0.5GB"):
        with pytest.raises(ConfigError, match="the memory size must be above 0"):
            parse_target_device(text)
    for text in ("1e400GiB", "99999999999999999999999GiB", "2e6GB"):
        with pytest.raises(ConfigError, match=r"more memory than any accelerator has \(over 1 PiB\)"):
            parse_target_device(text)
    assert parse_target_device("1.5e2GiB").memory_bytes == 150 * GIB and parse_target_device(".5GiB").memory_bytes == GIB // 2


def test_cluster_flags_are_for_the_dry_run_only(cli) -> None:
    assert_user_error(cli("--nnodes", "2", "--nproc-per-node", "8"), "--nnodes plans a cluster run and works with "
                      "--dry-run or --rehearse-rank only")
    assert_user_error(cli("--nnodes", "2", "--dry-run"), "together with --nproc-per-node")
    assert_user_error(cli("--dry-run", "--target-device", "V100"), '"V100" is not a known device')


def test_layouts_beyond_what_torch_or_this_machine_can_set_up_are_refused_at_once(cli) -> None:
    # Before: a pybind TypeError traceback (8e9 ranks do not fit torch's 32-bit rank numbers), and a dry run over
    # 2.4 million FSDP2 ranks that ran for hours (FSDP2 cuts each weight into one piece per shard rank, on meta too).
    r = cli("--spec", "llama3", "--flavor", "70B", "--nnodes", "1000000000", "--nproc-per-node", "8", "--dry-run")
    assert_user_error(r, "--nnodes 1000000000 x --nproc-per-node 8 = 8,000,000,000 ranks: torch numbers ranks with "
                      "32-bit integers, so a layout has at most 2,147,483,647")
    assert_user_error(cli("--nproc-per-node", "3000000000", "--dry-run"), "--nproc-per-node 3000000000 = 3,000,000,000 ranks")
    launcher_env = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    for mode in (("--dry-run",), ("--rehearse-rank", "0")):
        r = cli("--spec", "llama3", "--flavor", "70B", "--nnodes", "300000", "--nproc-per-node", "8",
                "--parallelism.tp=8", *mode)
        assert_user_error(r, "this layout shards every weight over 300,000 FSDP2 ranks (dp_shard x cp)",
                          "set --parallelism.dp_replicate so that dp_shard x cp is 16,384 or fewer")
    # the rehearsal set RANK and WORLD_SIZE for its one rank; main() puts them back when it returns
    assert {name: os.environ.get(name) for name in launcher_env} == launcher_env


def _rows(text: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["stage", "rank"])
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("peak:"):
            break
        rows.append(line.split())
    return rows


def test_70b_fsdp8_tp8_on_64_ranks_is_planned_exactly_without_using_this_machines_memory(cli) -> None:
    # Before: "16.4 GiB per rank ... only 0.3 GiB available per rank" (this machine's RAM / 64).
    r = cli("--spec", "llama3", "--flavor", "70B", "--nnodes", "8", "--nproc-per-node", "8", "--parallelism.tp=8",
            "--training.seq_len=8192", "--training.local_batch_size=1", "--dry-run")
    assert r.code == 0, r.text
    assert "target device: unknown (give --target-device NAME or SIZE to compare)" in r.text
    (row,) = _rows(r.text)
    # every weight split 64 ways, but the 161 norm weights (8192 each) are whole on each of the 8 tp ranks
    n_params, norms = 70_553_706_496, 161 * 8192
    expected = (n_params - norms) // 64 + norms // 8
    assert row[3] == f"{expected / 1e6:,.1f}"
    params, grads, optim = (float(x) for x in row[4:7])
    assert params == grads == pytest.approx(expected * 4 / GIB, abs=0.01) and optim == pytest.approx(2 * params, abs=0.01)
    assert "warning: activation checkpointing is off and activations are" in r.text


def test_a_plan_that_does_not_fit_names_what_helps(cli) -> None:
    r = cli("--spec", "llama3", "--flavor", "8B", "--nnodes", "2", "--nproc-per-node", "4", "--parallelism.pp=2",
            "--parallelism.tp=2", "--training.seq_len=8192", "--training.local_batch_size=4", "--dry-run",
            "--target-device", "L4")
    assert_user_error(r, "the planned run does not fit: its peak rank needs", "the L4 has 22.0 GiB",
                      "--activation_checkpoint.mode=full: about", "--training.local_batch_size=2",
                      "--parallelism.pp=4")
    rows = _rows(r.text)
    assert [row[0] for row in rows] == ["0", "1"] and all(row[-1] == "NO" for row in rows)
    # 1F1B: the first stage holds pp=2 micro-batches in flight, the last one
    assert float(rows[0][7]) > 1.5 * float(rows[1][7])
    for row in rows:
        columns = [float(x) for x in row[4:12]]
        live, total = float(row[12]), float(row[13])
        assert sum(columns) == pytest.approx(total, abs=0.05)
        # the last stage's loss moment and its blocks' backward are never live at once; other stages have no loss
        logits = columns[4]
        assert (live < total - 0.05) if logits else live == total


def test_activations_per_mode_from_one_meta_forward() -> None:
    from titan_core.plan.resolve import resolve_config
    from titan_core.train.activation_probe import probe_activations
    from titan_core.train.build import build_meta_model

    resolved = resolve_config(config_source=None, override_pairs=[("model.spec", "llama3")])
    model = build_meta_model(resolved).model
    probe = probe_activations(model, micro_batch=2, seq_len=64, dtype=torch.float32)
    assert list(probe.blocks) == [str(i) for i in range(6)]
    block = probe.blocks["3"]
    assert block.input_bytes == 2 * 64 * 256 * 4  # what full checkpointing keeps: the block's input
    assert block.input_bytes < block.input_bytes + block.selective_ops < block.saved
    assert probe.logits_bytes == 2 * 64 * model.args.vocab_size * 4
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert re.fullmatch(r"\d+", str(probe.outside))


def test_tensor_parallelism_keeps_the_gathered_inputs_of_column_wise_linears_whole() -> None:
    """Under TP a block's activations split over the tp ranks, except the inputs its column-wise linears
    saved after gathering them from the sequence shards (and, with per-op selective AC, the row-wise ones'
    partial-sum outputs): the plan counts those once per rank, whole."""
    from titan_core.config.sections import ActivationCheckpointSection
    from titan_core.plan.resolve import resolve_config
    from titan_core.train.activation_probe import probe_activations
    from titan_core.train.build import build_meta_model
    from titan_core.train.memory_plan import layer_activations

    resolved = resolve_config(config_source=None, override_pairs=[("model.spec", "llama3")])
    model = build_meta_model(resolved).model
    probe = probe_activations(model, micro_batch=2, seq_len=64, dtype=torch.float32)
    block = probe.blocks["0"]
    inputs = block.matmul_inputs
    assert sorted(inputs) == sorted(f"attention.{w}.weight" for w in ("wq", "wk", "wv", "wo")) + sorted(
        f"feed_forward.{w}.weight" for w in ("w1", "w2", "w3"))
    # q, k and v multiply one normed input; w1 and w3 another; each is a [2, 64, 256] float32 tensor
    assert inputs["attention.wq.weight"] == inputs["attention.wk.weight"] == inputs["attention.wv.weight"]
    assert inputs["feed_forward.w1.weight"] == inputs["feed_forward.w3.weight"] != inputs["attention.wq.weight"]
    columnwise = frozenset(n for n in inputs if n.split(".")[-2] in ("wq", "wk", "wv", "w1", "w3"))
    rowwise = frozenset(inputs) - columnwise
    whole = block.saved_inputs_of(columnwise)
    assert whole == 2 * (2 * 64 * 256 * 4)
    names = ("0",)
    none = ActivationCheckpointSection(mode="none")
    kept, _, working = layer_activations(probe, names, none, tp=2, columnwise=columnwise, rowwise=rowwise)
    assert kept == whole + (block.saved - whole) // 2
    # the backward's gradients: two of the block's largest tensors, the gathered input whole under TP
    largest = block.largest_saved
    assert largest == 2 * 64 * 768 * 4  # the SwiGLU's hidden activations, [2, 64, 768] float32
    assert working == 2 * max(largest // 2, block.input_bytes)
    assert layer_activations(probe, names, none) == (block.saved, 0, 2 * largest)  # no TP: all of it
    full = ActivationCheckpointSection(mode="full")
    assert layer_activations(probe, names, full, tp=2, columnwise=columnwise, rowwise=rowwise) == (
        block.input_bytes // 2, kept, working)  # the input is a sequence shard; the recompute is as above
    op = ActivationCheckpointSection(mode="selective")
    kept_op, _, _ = layer_activations(probe, names, op, tp=2, columnwise=columnwise, rowwise=rowwise)
    # Per-op selective AC keeps no row-wise output here: wo is an even matmul (recomputed) and w2, the block's
    # last, is not kept (its output only feeds the residual sum). Everything kept is split over the tp ranks.
    assert block.kept_outputs_of(rowwise) == 0
    assert sorted(block.kept_matmul_outputs) == ["attention.wq.weight", "attention.wv.weight", "feed_forward.w1.weight"]
    assert kept_op == (block.input_bytes + block.selective_ops) // 2


def test_the_plan_section_of_the_distributed_page_runs_as_written(tmp_path) -> None:
    from doc_commands import blocks, run_blocks

    pairs = [(command, copied) for command, copied in blocks("distributed.md") if "--target-device" in command]
    assert len(pairs) == 2
    run_blocks(pairs, tmp_path, exact=True)  # a plan on meta prints the same figures everywhere: the page's, to the digit


def test_end_stages_hold_fewer_layers_on_large_models_and_the_plan_shows_it(cli) -> None:
    from titan_core.parallel.pipeline import split_layers

    sizes = [len(s) for s in split_layers(126, 16, [], fewer_at_ends=-1)]
    assert sizes == [7, *[8] * 14, 7]  # the 405B split: 128 "layers" counting the embedding and the head
    assert [len(s) for s in split_layers(80, 4, [], fewer_at_ends=-1)] == [19, 21, 21, 19]
    assert [len(s) for s in split_layers(6, 2, [], fewer_at_ends=-1)] == [3, 3]  # small models: as before
    assert [len(s) for s in split_layers(7, 3, [], fewer_at_ends=-1)] == [3, 2, 2]
    assert [len(s) for s in split_layers(16, 4, [], fewer_at_ends=2)] == [3, 5, 5, 3]
    with pytest.raises(ConfigError, match="pp_end_stage_fewer_layers=3 leaves the first or last stage without"):
        split_layers(8, 4, [], fewer_at_ends=3)

    args = ("--spec", "llama3", "--flavor", "8B", "--nnodes", "1", "--nproc-per-node", "4", "--parallelism.pp=4",
            "--training.seq_len=2048", "--training.local_batch_size=4", "--dry-run", "--target-device", "H100")
    balanced, even = cli(*args), cli(*args, "--parallelism.pp_end_stage_fewer_layers=0")
    assert balanced.code == even.code == 0, balanced.text + even.text
    assert [row[2] for row in _rows(balanced.text)] == ["7", "9", "9", "7"]
    assert [row[2] for row in _rows(even.text)] == ["8", "8", "8", "8"]
    peak = lambda r: float(re.search(r"peak: ([\d.]+) GiB", r.text).group(1))  # noqa: E731
    assert peak(balanced) < peak(even)


def test_an_interleaved_rank_holds_its_in_flight_micro_batches_at_each_stages_size(cli) -> None:
    """Interleaved 1F1B warms up a round of pp micro-batches through a rank's first stage, then through its
    second: at the first backward rank 0 holds 8 stage-micro-batches of 4 layers, as many layer-micro-batches as
    1F1B's 4 micro-batches of 8 layers (the plan once counted all 8 of the rank's layers per stage-micro-batch,
    twice the real figure). The last rank holds 4 of its first stage and 1 of its second: 20 against 1F1B's 8."""
    args = ("--spec", "llama3", "--flavor", "8B", "--nnodes", "1", "--nproc-per-node", "4", "--parallelism.pp=4",
            "--parallelism.pp_microbatches=4", "--parallelism.pp_end_stage_fewer_layers=0",
            "--activation_checkpoint.mode=full", "--training.seq_len=2048", "--training.local_batch_size=4",
            "--dry-run", "--target-device", "H100")
    one_f_one_b = cli(*args)
    interleaved = cli(*args, "--parallelism.pp_schedule=Interleaved1F1B", "--parallelism.pp_stages_per_rank=2")
    assert one_f_one_b.code == interleaved.code == 0, one_f_one_b.text + interleaved.text
    plain, looped = _rows(one_f_one_b.text), _rows(interleaved.text)
    assert [row[0] for row in looped] == ["0,4", "1,5", "2,6", "3,7"] and [row[2] for row in looped] == ["8"] * 4
    activ = lambda rows, i: float(rows[i][7])  # noqa: E731  (recompute and working memory: the same block)
    unit = (activ(plain, 0) - activ(plain, 3)) / (32 - 8)  # one layer's kept input for one micro-batch
    assert unit > 0.01
    assert activ(looped, 0) == pytest.approx(activ(plain, 0), abs=0.02)
    assert activ(looped, 3) - activ(plain, 3) == pytest.approx(12 * unit, abs=0.02)
    # LoopedBFS runs every forward of both stages before its first backward: every rank holds 8 x 4 layers
    bfs = cli(*args, "--parallelism.pp_schedule=LoopedBFS", "--parallelism.pp_stages_per_rank=2")
    assert bfs.code == 0, bfs.text
    assert [activ(_rows(bfs.text), i) for i in range(4)] == pytest.approx([activ(plain, 0)] * 4, abs=0.02)


def test_the_in_flight_peak_is_read_from_the_schedules_own_program() -> None:
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    from titan_core.train.schedule_peak import peak_in_flight_bytes, schedule_program

    forward, backward = _ComputationType.FORWARD, _ComputationType.FULL_BACKWARD
    weight, inputs = _ComputationType.BACKWARD_WEIGHT, _ComputationType.BACKWARD_INPUT
    program = [_Action(0, forward, 0), _Action(0, forward, 1), _Action(4, forward, 0), _Action(4, backward, 0),
               _Action(4, forward, 1), _Action(0, inputs, 0), _Action(0, forward, 2), _Action(0, weight, 0)]
    # alive after each forward: {0/0}, {0/0, 0/1}, +4/0 -> 10 + 10 + 3; the split backward frees at its weight half
    assert peak_in_flight_bytes(program, {0: 10, 4: 3}) == 33
    for pp, microbatches in ((4, 4), (4, 8), (8, 8), (8, 32)):
        for rank in range(pp):
            ones = {s: 1 for s in range(2 * pp)}
            interleaved = schedule_program("Interleaved1F1B", pp=pp, local_stages=2, microbatches=microbatches,
                                           rank=rank)
            assert interleaved is not None
            # torch's warm-up: a round of pp through the first stage, 2 per hop from the last rank, then one more
            assert peak_in_flight_bytes(interleaved, ones) == min(2 * microbatches, pp + 2 * (pp - 1 - rank) + 1)
            bfs = schedule_program("LoopedBFS", pp=pp, local_stages=2, microbatches=microbatches, rank=rank)
            assert bfs is not None and peak_in_flight_bytes(bfs, ones) == 2 * microbatches
    assert schedule_program("1F1B", pp=4, local_stages=1, microbatches=4, rank=0) is None  # its formula serves


def test_rehearsal_trains_one_rank_of_a_64_rank_layout_here(tmp_path) -> None:
    from conftest import run_cli

    r = run_cli("--spec", "llama3", "--nnodes", "8", "--nproc-per-node", "8", "--parallelism.tp=8",
                "--rehearse-rank", "63", "--training.steps=2", "--training.seq_len=64", "--training.local_batch_size=2",
                f"--job.run_dir={tmp_path / 'run'}", "--metrics.report=false")
    assert r.code == 0, r.text
    assert "rehearsal: rank 63 of 64 under torch's fake process group" in r.text
    assert "finite checks are off" in r.text
    assert re.search(r"rehearsal done: 2 steps on rank 63 of 64, peak memory [\d.]+ GiB resident", r.text), r.text


def test_a_moe_layout_with_expert_parallelism_is_planned(cli) -> None:
    # the MoE block runs on meta (token counts only sized, no autocast there)
    r = cli("--spec", "qwen3", "--flavor", "debugmoe", "--nproc-per-node", "4", "--parallelism.ep=2",
            "--parallelism.pp=2", "--dry-run", "--target-device", "H100")
    assert r.code == 0, r.text
    rows = _rows(r.text)
    assert [row[0] for row in rows] == ["0", "1"] and all(float(row[7]) > 0 for row in rows)


def test_a_moe_layout_is_planned_in_float32_for_this_cpu(cli) -> None:
    # Without --target-device the plan is for this machine: float32 experts, whose grouped GEMM torch's
    # meta kernel refuses (it applies the CUDA kernel's bfloat16 rule); this used to end in a traceback.
    r = cli("--spec", "qwen3", "--flavor", "debugmoe", "--nproc-per-node", "2", "--parallelism.ep=2", "--dry-run")
    assert r.code == 0, r.text
    assert "float32 compute" in r.text and "Traceback" not in r.text
    rows = _rows(r.text)
    assert [row[0] for row in rows] == ["0"] and float(rows[0][7]) > 0, r.text
