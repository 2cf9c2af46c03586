"""Pipeline stages know what they receive and send before the first step (parallelism.pp_static_shapes).

Real runs use these shapes too, so neighbours need no shape handshake on a cluster; each
stage's sent output is checked against them. The dtype rule (the residual stream is in
FSDP's gather dtype when data- or context-parallel ranks shard or replicate the stages,
else in the weights' dtype) only shows in bfloat16: the rehearsals below run the sending
stage in bfloat16 on layouts of each kind, where a wrong rule stops the run. The parity of
real pipeline runs with one process (tests/llama/test_llama_parallel.py and the other
layout tests) runs with the shapes given, as every pipeline run now does.
"""

from __future__ import annotations

import pytest
import torch

from conftest import REPO, run_cli

TINY_BF16 = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=4", "--training.seq_len=32",
             "--training.local_batch_size=4", "--training.steps=1", "--training.dtype=bfloat16",
             "--metrics.report=false")


@pytest.mark.parametrize("layout", [
    pytest.param(("--nproc-per-node", "2", "--parallelism.pp=2"), id="pp2_weights_dtype"),
    pytest.param(("--nproc-per-node", "4", "--parallelism.pp=2", "--parallelism.cp=2"), id="pp2_cp2_gather_dtype"),
    pytest.param(("--nproc-per-node", "8", "--parallelism.pp=2", "--parallelism.tp=2", "--parallelism.dp_shard=2"),
                 id="pp2_tp2_fsdp2_sequence_shard"),
])
def test_the_first_stage_sends_what_its_neighbour_was_built_for_in_bfloat16(tmp_path, layout) -> None:
    r = run_cli(*TINY_BF16, *layout, "--rehearse-rank", "0", f"--job.run_dir={tmp_path / 'run'}")
    assert r.code == 0, r.text
    assert "pipeline stage 0 sends" not in r.text and "Traceback" not in r.text, r.text


WRONG_SHAPES = '''
import torch
from titan_core.parallel import pipeline

real = pipeline.static_stage_args


def half_width(*args, **kwargs):
    tokens, hidden = real(*args, **kwargs)
    wrong = torch.empty(*hidden.shape[:-1], hidden.shape[-1] // 2, dtype=hidden.dtype, device="meta",
                        requires_grad=True)
    return (tokens if kwargs["is_first"] else wrong), wrong


pipeline.static_stage_args = half_width
'''


def test_a_stage_that_sends_something_else_stops_the_run_with_the_setting_to_change(tmp_path) -> None:
    (tmp_path / "wrong_stage_shapes.py").write_text(WRONG_SHAPES)
    r = run_cli("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=2", "--training.seq_len=32",
                "--training.local_batch_size=4", "--training.steps=2", "--nproc-per-node", "2",
                "--parallelism.pp=2", "--import", "wrong_stage_shapes", f"--job.run_dir={tmp_path / 'run'}",
                env={"PYTHONPATH": f"{tmp_path}:{REPO}"}, timeout=300)
    assert r.code == 2, r.text
    errors = [line for line in r.err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(
        "titan-train: error: rank 0: pipeline stage 0 sends (2, 32, 256) float32, but the next stage was built to receive "
        "(2, 32, 128) float32"), r.err
    assert "--parallelism.pp_static_shapes=false" in errors[0] and "Traceback" not in r.text, r.text
    # and the way out works: torch learns the shapes from the first micro-batch
    ok = run_cli("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=2", "--training.seq_len=32",
                 "--training.local_batch_size=4", "--training.steps=2", "--nproc-per-node", "2",
                 "--parallelism.pp=2", "--parallelism.pp_static_shapes=false", "--import", "wrong_stage_shapes",
                 f"--job.run_dir={tmp_path / 'run2'}", env={"PYTHONPATH": f"{tmp_path}:{REPO}"},
                 timeout=300)
    assert ok.code == 0, ok.text


@pytest.mark.fast
def test_the_check_passes_the_declared_output_and_names_anything_else() -> None:
    from titan_core.errors import ConfigError
    from titan_core.parallel.pipeline import _sends_as_declared

    expected = torch.empty(2, 16, 64, dtype=torch.bfloat16, device="meta")
    check = _sends_as_declared(1, expected)
    check(torch.zeros(2, 16, 64, dtype=torch.bfloat16))
    check((torch.zeros(2, 16, 64, dtype=torch.bfloat16),))
    for sent, what in [(torch.zeros(2, 16, 64), "(2, 16, 64) float32"),
                       (torch.zeros(2, 32, 64, dtype=torch.bfloat16), "(2, 32, 64) bfloat16"),
                       ({"h": torch.zeros(1)}, "dict")]:
        with pytest.raises(ConfigError, match=rf"pipeline stage 1 sends {what.replace('(', '[(]').replace(')', '[)]')}, "
                                              r"but the next stage was built to receive \(2, 16, 64\) bfloat16"):
            check(sent)


@pytest.mark.fast
def test_an_error_of_ours_raised_in_a_stage_comes_out_as_itself() -> None:
    from titan_core.errors import ConfigError
    from titan_core.parallel.pipeline import step_schedule

    class Schedule:
        def __init__(self, cause: BaseException | None) -> None:
            self.cause = cause

        def step(self, *args: object, **kwargs: object) -> None:
            assert kwargs["return_outputs"] is False
            raise RuntimeError("stage 0 failed to run forward") from self.cause

    with pytest.raises(ConfigError, match="^the stage's own words$") as caught:
        step_schedule(Schedule(ConfigError("the stage's own words")), target=None)
    assert caught.value.__suppress_context__
    with pytest.raises(RuntimeError, match="failed to run forward"):  # anything else stays as torch raised it
        step_schedule(Schedule(ValueError("not ours")))
