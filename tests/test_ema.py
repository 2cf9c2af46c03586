"""[ema]: the exponential moving average of the weights (train/ema.py).

One short in-process run with an EMA (4 steps, a checkpoint every 2) is shared by most tests: its
EMA must equal an average computed by hand from the weights after each step, its export at the end
must hold that EMA, a resume from its step-2 checkpoint must reproduce its step-4 EMA byte for byte,
and titan-convert must write it to a Hugging Face folder. One real 2-process FSDP2 run must give the
EMA one process gives, each rank holding only its shard of it.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from conftest import DEBUG_LLAMA_2_LAYERS, titan

DECAY = 0.9
# The parity tests' model (the llama3 debug model with 2 layers, 32-token windows), a global batch of 4.
TINY = ["model.spec=llama3", "model.flavor=debugmodel", "llama3.n_layers=2", "training.seq_len=32",
        "training.local_batch_size=4", "lr_scheduler.warmup_steps=1", "metrics.log_freq=1", "metrics.report=false"]


@dataclass
class TinyRun:
    trainer: Any
    weights: list[dict[str, torch.Tensor]]  # the parameters before the first step, then after each step
    out: str


def tiny_run(run_dir: Path, *pairs: str) -> TinyRun:
    """An in-process run of the tiny model; ``pairs`` are ``section.key=value`` overrides."""
    from titan_core import Trainer
    from titan_core.checkpoint.states import named_parameters
    from titan_core.plan.resolve import resolve_config

    overrides = [tuple(p.split("=", 1)) for p in (*TINY, f"job.run_dir={run_dir}", *pairs)]
    trainer = Trainer(resolve_config(config_source=None, override_pairs=overrides))  # type: ignore[arg-type]
    trainer.setup()
    weights: list[dict[str, torch.Tensor]] = []

    def snapshot() -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in named_parameters(trainer.model_parts)}

    step = trainer.train_step

    def recording_step(batches: Any) -> Any:
        if not weights:  # the weights the run starts from (initialised, or resumed)
            weights.append(snapshot())
        result = step(batches)
        weights.append(snapshot())
        return result

    trainer.train_step = recording_step
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        trainer.train()
    return TinyRun(trainer, weights, out.getvalue())


def by_hand(weights: list[dict[str, torch.Tensor]], decay: float, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The EMA as written: start at the first weights, then decay * ema + (1 - decay) * w for each later one."""
    ema = {k: v.to(dtype) for k, v in weights[0].items()}
    for after_step in weights[1:]:
        ema = {k: ema[k] * decay + after_step[k].to(dtype) * (1 - decay) for k in ema}
    return ema


def ema_tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    from titan_core.checkpoint import read_checkpoint_tensors

    return {k.removeprefix("ema."): v for k, v in read_checkpoint_tensors(checkpoint).items() if k.startswith("ema.")}


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    run_dir = tmp_path_factory.mktemp("ema") / "run"
    return tiny_run(run_dir, "training.steps=4", f"ema.decay={DECAY}", "checkpoint.enable=true",
                    "checkpoint.interval=2", "checkpoint.keep_latest_k=0", "checkpoint.export_at_end=true",
                    "checkpoint.export_weights=ema")


def test_the_ema_equals_an_average_computed_by_hand_from_the_weights_after_each_step(ema_run: TinyRun) -> None:
    ema = ema_run.trainer.ema
    assert len(ema_run.weights) == 5  # the start and 4 steps
    mine = dict(zip(ema.names, ema.averages))
    saved = ema_tensors(ema_run.trainer.run_dir / "checkpoints" / "step-000004")
    assert sorted(mine) == sorted(saved) == sorted(ema_run.weights[0])
    same_order = by_hand(ema_run.weights, DECAY, torch.float32)
    exact = by_hand(ema_run.weights, DECAY, torch.float64)
    for name, average in mine.items():
        assert average.dtype == torch.float32
        assert torch.equal(saved[name], average), name  # the checkpoint holds what the run holds
        assert (average - same_order[name]).abs().max().item() <= 1e-7, name
        # against float64: float32's own rounding (a few ulp of each value) and no more
        assert torch.allclose(average.double(), exact[name], rtol=1e-6, atol=1e-7), name
    # the average is not just the weights: it lags them
    last = ema_run.weights[-1]
    assert max((mine[k] - last[k]).abs().max().item() for k in mine) > 1e-3


def test_export_at_end_writes_the_ema_and_says_so(ema_run: TinyRun) -> None:
    exported = load_file(ema_run.trainer.run_dir / "export" / "model.safetensors")
    ema = ema_run.trainer.ema
    for name, average in zip(ema.names, ema.averages):
        assert torch.equal(exported[name], average), name
    assert "(the EMA weights)" in ema_run.out, ema_run.out
    # the trained weights are back in the model after the export
    params = dict(zip(ema.names, ema.weights()))
    assert all(torch.equal(params[k], v) for k, v in ema_run.weights[-1].items())


def test_a_resume_reproduces_the_ema_byte_for_byte(ema_run: TinyRun, tmp_path: Path) -> None:
    first = ema_run.trainer.run_dir / "checkpoints"
    resumed = tiny_run(tmp_path / "resumed", "training.steps=4", f"ema.decay={DECAY}", "checkpoint.enable=true",
                       "checkpoint.interval=2", f"checkpoint.resume={first / 'step-000002'}")
    assert len(resumed.weights) == 3  # steps 3 and 4 only
    again, once = ema_tensors(tmp_path / "resumed" / "checkpoints" / "step-000004"), ema_tensors(first / "step-000004")
    assert sorted(again) == sorted(once)
    for name in once:
        assert again[name].numpy().tobytes() == once[name].numpy().tobytes(), name


def test_a_run_without_ema_resumes_from_a_checkpoint_with_one(ema_run: TinyRun, tmp_path: Path) -> None:
    step2 = ema_run.trainer.run_dir / "checkpoints" / "step-000002"
    later = tiny_run(tmp_path / "later", "training.steps=3", "checkpoint.enable=true", f"checkpoint.resume={step2}")
    assert later.trainer.ema is None and len(later.weights) == 2  # step 3 only
    assert all(torch.equal(later.weights[0][k], v) for k, v in ema_run.weights[2].items())  # the step-2 weights


def test_a_checkpoint_without_ema_resumes_with_the_ema_starting_from_its_weights(tmp_path: Path,
                                                                                 capsys: pytest.CaptureFixture[str]
                                                                                 ) -> None:
    from titan_core.commands.convert import main as convert_main

    plain = tiny_run(tmp_path / "plain", "training.steps=2", "checkpoint.enable=true")
    assert plain.trainer.ema is None
    step2 = tmp_path / "plain" / "checkpoints" / "step-000002"
    assert not ema_tensors(step2)
    later = tiny_run(tmp_path / "later", "training.steps=3", "ema.decay=0.5", "checkpoint.enable=true",
                     f"checkpoint.resume={step2}")
    assert all(torch.equal(later.weights[0][k], v) for k, v in plain.weights[-1].items())  # it resumed
    expected = by_hand(later.weights, 0.5, torch.float32)
    ema = later.trainer.ema
    for name, average in zip(ema.names, ema.averages):
        assert torch.equal(average, expected[name]), name
    # asking titan-convert for the EMA of a checkpoint that has none: one message, exit 2, nothing written
    capsys.readouterr()
    code = convert_main(["to-hf", "--weights", "ema", str(step2), str(tmp_path / "hf")])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert "holds no EMA of the weights" in captured.err and "--weights raw" in captured.err, captured.err
    assert "Traceback" not in captured.err and not (tmp_path / "hf").exists()


def test_titan_convert_writes_the_ema_or_the_raw_weights_and_says_which(ema_run: TinyRun, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from titan_core.commands.convert import main as convert_main
    from titan_core.train.whole_model import load_hf_folder

    step4 = ema_run.trainer.run_dir / "checkpoints" / "step-000004"
    ema = ema_run.trainer.ema
    for weights, expected in (("ema", dict(zip(ema.names, ema.averages))), ("raw", ema_run.weights[-1])):
        capsys.readouterr()
        assert convert_main(["to-hf", "--weights", weights, str(step4), str(tmp_path / weights)]) == 0
        said = "the EMA weights" if weights == "ema" else "the raw weights"
        assert f"to {tmp_path / weights} ({said})" in capsys.readouterr().out
        back = dict(load_hf_folder(tmp_path / weights, spec_name="llama3", what="test").model.named_parameters())
        assert all(torch.equal(back[k], v) for k, v in expected.items())


# ---- FSDP2 x 2 against one process ---------------------------------------------------------------------------


@pytest.mark.slow
def test_fsdp2_keeps_the_ema_sharded_and_equal_to_one_process(tmp_path: Path) -> None:
    from titan_core.checkpoint.identity import read_record
    from titan_core.checkpoint.tensor_index import read_index

    # The two layouts' weights differ by float rounding (about 1e-5 after 3 Adam steps); a decay of 0.99 carries
    # a few percent of that into the EMA, while an average of the wrong shard would be off by the weights' size.
    steps = ("training.steps=3", "ema.decay=0.99", "checkpoint.enable=true")
    reference = tiny_run(tmp_path / "one", *steps)
    run = titan(tmp_path / "two", *DEBUG_LLAMA_2_LAYERS, *(f"--{p}" for p in steps), "--training.local_batch_size=2",
                "--lr_scheduler.warmup_steps=1", "--metrics.report=false", "--parallelism.dp_shard=2",
                "--checkpoint.export_at_end=true", "--checkpoint.export_weights=ema", nproc=2)
    assert run.code == 0, run.text
    one = ema_tensors(tmp_path / "one" / "checkpoints" / "step-000003")
    saved = tmp_path / "two" / "checkpoints" / "step-000003"
    two = ema_tensors(saved)
    assert sorted(one) == sorted(two) and one
    worst = max((one[k] - two[k]).abs().max().item() for k in one)
    assert worst <= 1e-6, worst
    moved = max((one[k] - reference.weights[0][k]).abs().max().item() for k in one)
    assert moved > 1e-5, moved  # the EMA did move away from the starting weights: the comparison can fail
    # the export swapped the sharded EMA into the sharded model: the file holds it, whole
    exported = load_file(tmp_path / "two" / "export" / "model.safetensors")
    assert all(torch.equal(exported[k], v) for k, v in two.items())
    assert "(the EMA weights)" in run.text
    # each rank saved its own shard, laid out as the parameter's: nothing was gathered
    index = read_index(saved, read_record(saved).files)
    for name in one:
        if one[name].shape[0] >= 2:
            ema_files = sorted(c.file for c in index.tensors[f"ema.{name}"].chunks)
            model_files = sorted(c.file for c in index.tensors[f"model.{name}"].chunks)
            assert len(ema_files) == 2 and len(set(ema_files)) == 2 and len(model_files) == 2, name
