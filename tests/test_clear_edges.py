"""Clearer edges, each through the real CLI: a path names the setting it came from, --print-config
stays TOML when a config function prints, a run folder whose name is not UTF-8 round-trips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tomllib

from conftest import REPO, assert_user_error, run_cli

TINY = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=16",
        "--training.local_batch_size=1", "--training.steps=1")


def test_a_path_that_cannot_be_used_names_its_setting(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    assert_user_error(run_cli(*TINY, f"--job.run_dir={tmp_path / 'afile' / 'run'}"),
                      f"cannot use {tmp_path / 'afile' / 'run'}: a path component is a file",
                      "The path comes from job.run_dir.")
    result = run_cli(*TINY, f"--job.run_dir={tmp_path / 'run'}", "--profiling.enable=true", "--profiling.start_step=1",
                     f"--profiling.folder={tmp_path / 'afile' / 'prof'}")
    assert_user_error(result, f"cannot use {tmp_path / 'afile' / 'prof' / 'rank0'}: a path component is a file",
                      "The path comes from profiling.folder.")


def test_print_config_stays_toml_when_the_config_function_prints(tmp_path: Path) -> None:
    (tmp_path / "chatty_configs.py").write_text(
        'print("importing chatty_configs")\n'
        "def tiny():\n"
        '    print("building the config")\n'
        '    return {"training": {"steps": 3}, "optimizer": {"param_groups": [{"name": "emb", '
        '"patterns": ["tok_embeddings.*"], "lr_mult": 0.5}]}}\n'
    )
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    result = run_cli("--spec", "llama3", "--config", "chatty_configs:tiny", "--print-config", env=env)
    assert result.code == 0, result.text
    config = tomllib.loads(result.out)  # stdout is the TOML and only the TOML
    assert config["training"]["steps"] == 3
    assert config["optimizer"]["param_groups"] == [{"name": "emb", "patterns": ["tok_embeddings.*"], "lr_mult": 0.5}]
    assert "importing chatty_configs" in result.err and "building the config" in result.err
    # and what it printed reads back through --config
    (tmp_path / "printed.toml").write_text(result.out)
    again = run_cli("--spec", "llama3", "--config", str(tmp_path / "printed.toml"), "--print-config")
    assert again.code == 0 and again.out == result.out, again.text


def test_a_run_folder_whose_name_is_not_utf8_writes_a_config_that_reads_back(tmp_path: Path) -> None:
    run_dir = os.fsencode(tmp_path) + b"/caf\xe9-\xff"  # latin-1 bytes: not UTF-8
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [os.fsencode(sys.executable), b"-m", b"titan_core", *(a.encode() for a in TINY), b"--job.run_dir=" + run_dir]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")
    written = os.path.join(run_dir, b"config.toml")
    assert os.path.exists(os.path.join(run_dir, b"metrics.jsonl"))
    back = subprocess.run([os.fsencode(sys.executable), b"-m", b"titan_core", b"--spec", b"llama3", b"--config",
                           written, b"--print-config", b"--job.description=read back"],
                          cwd=REPO, env=env, capture_output=True, timeout=120)
    assert back.returncode == 0, back.stderr.decode(errors="replace")
    config = tomllib.loads(back.stdout.decode("utf-8", "surrogateescape"))
    assert os.fsencode(config["job"]["run_dir"]) == run_dir
    assert config["training"]["steps"] == 1 and config["job"]["description"] == "read back"
