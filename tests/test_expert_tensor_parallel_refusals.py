"""parallelism.etp refused with one message naming what is wrong and how to fix it, exit 2, no traceback:
an etp other than 1 or tp, experts a converter rewrote (not supported yet), and etp on a model without
experts (caught by the launcher before any worker starts). The layouts themselves are tested against one
process in tests/qwen3/test_qwen3_parallel.py (ETP 2 x EP 2, x PP 2, x CP 2) and
tests/deepseek/test_deepseek_tp.py (TP 2 + ETP 2)."""

from __future__ import annotations

from pathlib import Path

from conftest import run_main, titan

MOE = ("--spec", "qwen3", "--flavor", "debugmoe", "--training.steps=1", "--training.seq_len=32")


def test_etp_must_be_one_or_tp(capsys, tmp_path: Path) -> None:
    out = run_main(capsys, *MOE, "--parallelism.etp=3", f"--job.run_dir={tmp_path}")
    text = out.out + out.err
    assert out.code == 2, text
    assert "parallelism.etp=3 with parallelism.tp=1" in text and "etp is 1" in text and "Traceback" not in text


def test_etp_of_converted_experts_is_refused(tmp_path: Path) -> None:
    run = titan(tmp_path, *MOE, "--parallelism.tp=2", "--parallelism.etp=2", "--converters", "mx", "--mx.fqns=[]",
                "--mx.moe_fqns=[\"experts\"]", nproc=2)
    assert run.code == 2, run.text
    assert "parallelism.etp=2: the experts of layers.0.moe.experts were converted" in run.text
    assert "mx.moe_fqns=[]" in run.text and "Traceback" not in run.text
    assert not (tmp_path / "metrics.jsonl").exists()


def test_etp_on_a_dense_model_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    run = titan(tmp_path, "--spec", "llama3", "--flavor", "debugmodel", "--training.steps=1",
                "--parallelism.tp=2", "--parallelism.etp=2", nproc=2)
    assert run.code == 2, run.text
    assert "parallelism.etp=2 splits each expert" in run.text and "has no experts" in run.text, run.text
    assert "Set parallelism.etp=1" in run.text and "Traceback" not in run.text
    assert "[rank" not in run.text  # the launcher said it once; no worker started
