"""Expert parallelism (``--parallelism.ep``) through the real CLI, against one process.

qwen3 ``debugmoe`` cut to 2 layers (8 experts each, top 2), 32-token sequences, a global
batch of 4 rows: one process (4 rows), EP 2 on 2 processes (2 rows each: the experts of
every layer split 4 + 4, tokens exchanged by all-to-all) and EP 2 x FSDP2 on 4 processes
(1 row each: 2 EP groups, each rank's 4 experts sharded over 2 ranks; with full activation
checkpointing). The loader gives
every layout the same rows, so the 10 losses agree within float32 reduction order, and
the MoE figures (summed over all ranks) match those of one process. The EP 2 run is compiled
(``--compile.enable=true``) and still matches the eager process.

A checkpoint crosses the layouts both ways: the EP 2 run's step-5 checkpoint loads on one
process bit for bit (its export equals the checkpoint's tensors), and one process's step-5
checkpoint resumes on EP 2, whose steps 6-10 match the unbroken one-process run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from titan_core.checkpoint import read_checkpoint_tensors

from conftest import Run, assert_user_error, titan

MOE = ("--spec", "qwen3", "--flavor", "debugmoe", "--qwen3.n_layers=2", "--training.seq_len=32",
       "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=1", "--training.seed=0", "--metrics.report=false",
       "--qwen3.moe_aux_loss_coeff=0.01", "--checkpoint.interval=5", "--checkpoint.keep_latest_k=0")
STEPS = ("--training.steps=10",)
ONE = ("--training.local_batch_size=4",)
EP2 = ("--parallelism.ep=2", "--training.local_batch_size=2")
EP2_FSDP2 = ("--parallelism.ep=2", "--training.local_batch_size=1")
REL = 1e-6


def _by_step(run: Run) -> dict[int, dict[str, float]]:
    return {int(r["step"]): r for r in run.records()}


def _assert_close(run: Run, ref: Run, steps: range) -> None:
    a, b = _by_step(run), _by_step(ref)
    assert sorted(a) == list(steps), run.text
    for step in steps:
        x, y = a[step], b[step]
        assert abs(x["loss"] - y["loss"]) <= REL * abs(y["loss"]), (step, x["loss"], y["loss"])
        # Routing happens before the exchange and the counts are summed over every rank: the same
        # load as one process; the per-sequence auxiliary loss does not depend on the layout either.
        assert x["moe_load_imbalance"] == y["moe_load_imbalance"], step
        assert abs(x["moe_aux_loss"] - y["moe_aux_loss"]) <= 1e-5 * y["moe_aux_loss"], step


def test_ep2_and_ep2_x_fsdp2_match_one_process_and_checkpoints_cross_layouts(tmp_path: Path) -> None:
    one = titan(tmp_path / "one", *MOE, *STEPS, *ONE, "--checkpoint.enable=true")
    assert one.code == 0, one.text
    # Compiled: every block is compiled around its experts (dispatch and all-to-all stay eager).
    ep2 = titan(tmp_path / "ep2", *MOE, *STEPS, *EP2, "--checkpoint.enable=true", "--compile.enable=true", nproc=2)
    assert ep2.code == 0, ep2.text
    # The experts really are split: 3 stacked weights x 2 layers over the ep mesh, the rest over dp_shard.
    assert "6 x expert_dp_shard:S(1), ep:S(0)" in ep2.text and "dp_shard:S(0)" in ep2.text
    _assert_close(ep2, one, range(1, 11))
    # With activation checkpointing: the recompute in backward repeats the exchanges on every rank.
    both = titan(tmp_path / "ep2_fsdp2", *MOE, *STEPS, *EP2_FSDP2, "--activation_checkpoint.mode=full", nproc=4)
    assert both.code == 0, both.text
    _assert_close(both, one, range(1, 11))

    # EP 2 -> one process: the weights load bit for bit (exported before any further step).
    saved = tmp_path / "ep2" / "checkpoints" / "step-000005"
    loaded = titan(tmp_path / "ep2_to_one", *MOE, *ONE, "--training.steps=5", f"--checkpoint.resume={saved}",
                   "--checkpoint.enable=true", "--checkpoint.export_at_end=true")
    assert loaded.code == 0, loaded.text
    exported = load_file(tmp_path / "ep2_to_one" / "export" / "model.safetensors")
    tensors = {k.removeprefix("model."): v for k, v in read_checkpoint_tensors(saved).items() if k.startswith("model.")}
    assert any(".moe.experts.w1" in k for k in exported)
    for key, value in exported.items():
        assert torch.equal(value, tensors[key]), key

    # One process -> EP 2: steps 6-10 continue the one-process run (model, optimizer, data, router bias).
    resumed = titan(tmp_path / "one_to_ep2", *MOE, *STEPS, *EP2, "--checkpoint.enable=true",
                    f"--checkpoint.resume={tmp_path / 'one' / 'checkpoints' / 'step-000005'}", nproc=2)
    assert resumed.code == 0, resumed.text
    _assert_close(resumed, one, range(6, 11))


@pytest.mark.parametrize(("args", "nproc", "message"), [
    pytest.param(("--flavor", "debugmoe", "--parallelism.ep=3"), 2,
                 "parallelism.ep=3 does not divide the data-parallel shard degree dp_shard=2", id="ep-vs-dp"),
    pytest.param(("--flavor", "debugmoe", "--parallelism.ep=3"), 3,
                 "parallelism.ep=3 does not divide the 8 experts of layers.0.moe.experts", id="ep-vs-experts"),
    pytest.param(("--flavor", "debugmodel", "--parallelism.ep=2"), 2,
                 "parallelism.ep=2 splits the experts of MoE layers over ranks, but spec qwen3, flavor debugmodel "
                 "has no experts", id="dense"),
])
def test_ep_refusals_are_one_message_exit_2(cli: Any, tmp_path: Path, args: tuple[str, ...], nproc: int,
                                           message: str) -> None:
    # Refused by the launching process (here in-process: the launcher's own code path), before any worker starts.
    result = cli("--nproc-per-node", str(nproc), "--spec", "qwen3", *args, f"--job.run_dir={tmp_path / 'run'}")
    assert_user_error(result, message)
    assert result.text.count("error:") == 1 and "invalid configuration" not in result.text
    assert not (tmp_path / "run").exists()
