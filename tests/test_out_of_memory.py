"""Running out of memory mid-run is the run's shape, not a plugin bug: one message naming the step, the
failed allocation and the settings that lower memory; exit 2; no traceback."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from titan_core.runtime.out_of_memory import is_out_of_memory, out_of_memory_error

from conftest import REPO, CliResult, assert_user_error

TINY = ("--spec", "llama3", "--training.seq_len=32", "--training.local_batch_size=2", "--training.steps=2")
FIXES = ("--training.local_batch_size", "--training.global_batch_size", "--activation_checkpoint.mode=full")


def test_torch_allocation_failures_are_recognised_and_sized() -> None:
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity ...")
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 536870912 bytes. Error code 12 (Cannot allocate memory)")
    wrapped = RuntimeError("stage failed")
    wrapped.__cause__ = cpu
    assert all(is_out_of_memory(e) for e in (cuda, cpu, wrapped, MemoryError()))
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"))
    assert ": an allocation of 2.00 GiB failed." in str(out_of_memory_error(cuda, where="in step 3"))
    assert "out of memory in step 3: an allocation of 512.0 MiB failed." in str(out_of_memory_error(wrapped, where="in step 3"))
    assert "allocation of" not in str(out_of_memory_error(MemoryError(), where="in step 1"))


def test_out_of_memory_in_a_plugins_forward_names_the_step_not_the_plugin(
    cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from titan_llama.model import Transformer

    def forward(self: Transformer, tokens: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(Transformer, "forward", forward)
    result: CliResult = cli(*TINY, f"--job.run_dir={tmp_path / 'run'}")
    assert_user_error(result, "out of memory in step 1, in the model's forward of spec \"llama3\" (titan-llama 0.1.0): "
                              "an allocation of 20.00 GiB failed.", *FIXES)
    assert "problem in the plugin" not in result.text


def test_a_real_cpu_allocation_failure_is_one_clear_error(tmp_path: Path) -> None:
    """An address-space limit makes the first step's activations fail to allocate, as a too-big batch does."""
    # Room for torch and the model, not for 256 x 2048 tokens of activations. 4 GiB fails in ~15 s;
    # 6 GiB let the forward run ~2 minutes before the failing allocation.
    limit = 4 * 2**30

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.run(
        [sys.executable, "-m", "titan_core", "--spec", "llama3", "--training.local_batch_size=256",
         "--training.seq_len=2048", "--training.steps=1", f"--job.run_dir={tmp_path / 'run'}"],
        cwd=REPO, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=300, preexec_fn=cap_memory,
    )
    result = CliResult(proc.returncode, proc.stdout, proc.stderr)
    assert_user_error(result, "out of memory in step 1", "an allocation of", "MiB failed", *FIXES)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_out_of_memory_while_setting_up_names_the_phase_and_the_plugin_method(
    cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from titan_llama.model import Transformer

    def init_buffers(self: Transformer) -> None:
        raise MemoryError()

    monkeypatch.setattr(Transformer, "init_buffers", init_buffers)
    result: CliResult = cli(*TINY, f"--job.run_dir={tmp_path / 'run'}")
    assert_user_error(result, "out of memory while setting up, validating or saving the run, in the model's "
                              "init_parameter/init_buffers of spec \"llama3\" (titan-llama 0.1.0). Lower", *FIXES)
    assert "activations" not in result.text  # only a step's failure is put down to activations
