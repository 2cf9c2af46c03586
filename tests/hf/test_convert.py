"""``titan-convert`` both ways, on the checkpoint of an FSDP2 x2 run, and its errors.

to-hf of the run's last checkpoint equals the run's own hf export bit for bit; from-hf
of that export, converted back to-hf, is bit-identical again; a run started from the
from-hf checkpoint has the step-1 loss of a run started from the HF folder itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_hf_export import hf_tensors

from conftest import CliResult, assert_user_error, trained
from hf_helpers import GLOBAL_BATCH, REPO, tiny_hf_llama, titan


def convert(*args: str, console_script: bool = False) -> CliResult:
    cmd = [str(Path(sys.executable).parent / "titan-convert")] if console_script else \
        [sys.executable, "-m", "titan_core.commands.convert"]
    proc = subprocess.run([*cmd, *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def test_convert_both_ways_on_an_fsdp2_checkpoint(tmp_path: Path) -> None:
    source = tiny_hf_llama(tmp_path / "hf", tied=True)
    run = titan(tmp_path / "run", f"--checkpoint.initial_load={source}", "--training.steps=2",
                "--checkpoint.enable=true", "--checkpoint.export_at_end=true", "--checkpoint.export_format=hf",
                "--parallelism.dp_shard=2", f"--training.local_batch_size={GLOBAL_BATCH // 2}", nproc=2)
    assert run.code == 0, run.text
    step = tmp_path / "run" / "checkpoints" / "step-000002"
    # the load titan-convert makes goes down the layers: no call climbs back up (scripts/call_path.py)
    path = subprocess.run([sys.executable, str(REPO / "scripts/call_path.py"), str(step)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert path.returncode == 0, path.stderr
    assert "calls climbing back up a layer: 0 (0 distinct)" in path.stdout, path.stdout

    to_hf = convert("to-hf", str(step), str(tmp_path / "out_hf"), "--progress", "always", console_script=True)
    assert to_hf.code == 0, to_hf.text
    assert "[titan-convert] writing: 19 tensors" in to_hf.err  # 20 state-dict keys, the tied head shared
    exported, converted = hf_tensors(tmp_path / "run" / "export" / "hf"), hf_tensors(tmp_path / "out_hf")
    assert sorted(converted) == sorted(exported) and "lm_head.weight" not in converted
    assert all(torch.equal(converted[k], exported[k]) for k in exported)
    assert json.loads((tmp_path / "out_hf" / "config.json").read_text()) == \
        json.loads((tmp_path / "run" / "export" / "hf" / "config.json").read_text())

    # titan-generate reads the same sharded checkpoint on one process: the export's greedy tokens.
    from titan_core.models.sampling import Sampling, sample
    from titan_core.train.whole_model import load_hf_folder, load_titan_checkpoint

    greedy = Sampling(max_new_tokens=8)
    sharded = sample(load_titan_checkpoint(step).model, [5, 17, 300, 42], greedy)
    assert sharded == sample(load_hf_folder(tmp_path / "out_hf", spec_name=None, what="test").model, [5, 17, 300, 42],
                             greedy)
    assert len(sharded) == 8

    from_hf = convert("from-hf", "--spec", "llama3", str(tmp_path / "out_hf"), str(tmp_path / "ckpt"))
    assert from_hf.code == 0, from_hf.text
    titan_ckpt = tmp_path / "ckpt" / "step-000000"
    assert (titan_ckpt / "titan_checkpoint.json").is_file()
    again = convert("to-hf", str(titan_ckpt), str(tmp_path / "again"))
    assert again.code == 0, again.text
    back = hf_tensors(tmp_path / "again")
    assert sorted(back) == sorted(exported) and all(torch.equal(back[k], exported[k]) for k in exported)

    # Starting a run from the converted checkpoint = starting it from the HF folder.
    small = ("training.seq_len=32", f"training.local_batch_size={GLOBAL_BATCH}", "training.steps=1")
    _, from_ckpt = trained(tmp_path / "a", *small, f"checkpoint.initial_load={titan_ckpt}")
    _, from_folder = trained(tmp_path / "b", *small, f"checkpoint.initial_load={tmp_path / 'out_hf'}")
    assert from_ckpt == from_folder


def test_wrong_folder_kinds_are_one_message_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from titan_core.commands.convert import main


    hf = tiny_hf_llama(tmp_path / "hf")
    (tmp_path / "run" / "checkpoints" / "step-000004").mkdir(parents=True)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    cases = [
        (("to-hf", str(hf), str(tmp_path / "o1")), ("is already a Hugging Face folder", "Did you mean from-hf?")),
        (("to-hf", str(tmp_path / "run" / "checkpoints"), str(tmp_path / "o2")),
         ("is not a titan checkpoint (no titan_checkpoint.json)", "holds step-N folders")),
        (("from-hf", str(tmp_path / "run"), str(tmp_path / "o3")), ("has no config.json",)),
        (("from-hf", str(hf), str(tmp_path / "full")), ("already exists and is not an empty folder",)),
    ]
    for args, fragments in cases:
        code = main(list(args))
        captured = capsys.readouterr()
        result = CliResult(code, captured.out, captured.err)
        assert_user_error(result, *fragments)
        assert result.err.count("titan-convert: error:") == 1
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
