"""What a plugin author hits first: converter errors before any worker starts, one TP-style owner,
and --compare-baseline refusing to train when it could not draw the plot."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from titan_core import ConfigError, ModelConverter, TensorParallelStyles
from titan_core.commands.titan_train import main
from titan_core.train.tp_styles import resolve_tp_styles

PLUGINS = textwrap.dedent('''
    from titan_core import ModelConverter, TensorParallelStyles, TitanError, register_model_converter

    class Boom(ModelConverter):
        plugin_api_version = "1.0"
        def __init__(self, config, *, parallel_dims, job):
            super().__init__(config, parallel_dims=parallel_dims, job=job)
            raise TitanError(f"boom needs a GPU (tp={parallel_dims.tp}, backend={job.backend})")
        def select(self, model): return []
        def convert(self, model, fqns): pass

    class Styled(ModelConverter):
        plugin_api_version = "1.0"
        def tensor_parallel_styles(self): return TensorParallelStyles.default()
        def select(self, model): return ["layers.0.w1"]
        def convert(self, model, fqns): pass

    class StyledToo(Styled):
        def select(self, model): return ["layers.0.w2"]

    register_model_converter("boom", Boom)
    register_model_converter("styled", Styled)
    register_model_converter("styled_too", StyledToo)
''')


def _launch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "preflight_plugins.py").write_text(PLUGINS)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "titan_core", "--import", "titan_core.testing.tiny_spec", "--import",
           "preflight_plugins", "--spec", "tiny", f"--job.run_dir={tmp_path / 'run'}", "--nproc-per-node", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def test_a_converter_init_error_is_reported_once_before_any_worker_starts(tmp_path: Path) -> None:
    proc = _launch(tmp_path, "--converters", "boom", "--parallelism.tp=2")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # Built with the workers' inputs (tp=2, gloo), reported once, by the launcher (no rank prefix).
    assert proc.stderr.count("boom needs a GPU (tp=2, backend=gloo)") == 1, proc.stderr
    assert "titan-train: error: boom needs a GPU" in proc.stderr
    assert "[rank" not in proc.stderr and "loading tokenizer" not in proc.stderr + proc.stdout
    assert not (tmp_path / "run").exists()


def test_two_converters_supplying_tp_styles_is_an_error_before_any_worker_starts(tmp_path: Path) -> None:
    proc = _launch(tmp_path, "--converters", "styled,styled_too", "--parallelism.tp=2")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "converters styled, styled_too each supply their own tensor-parallel styles" in proc.stderr
    assert "[rank" not in proc.stderr and "Traceback" not in proc.stderr


class _Conv(ModelConverter):
    plugin_api_version = "1.0"

    def __init__(self, styles: TensorParallelStyles | None) -> None:
        self.styles = styles

    def tensor_parallel_styles(self) -> TensorParallelStyles | None:
        return self.styles

    def select(self, model: object) -> list[str]:
        return []

    def convert(self, model: object, fqns: list[str]) -> None:
        pass


def test_tp_styles_come_from_the_one_converter_that_supplies_them() -> None:
    mine = TensorParallelStyles(int, float, str)
    assert resolve_tp_styles([("a", _Conv(None)), ("b", _Conv(mine))]) is mine
    assert resolve_tp_styles([("a", _Conv(None))]) == TensorParallelStyles.default()
    with pytest.raises(ConfigError, match="converters a, b each supply"):
        resolve_tp_styles([("a", _Conv(mine)), ("b", _Conv(mine))])


def test_compare_baseline_without_matplotlib_stops_before_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    code = main(["--import", "titan_core.testing.tiny_spec", "--spec", "tiny", "--converters", "float8",
                 "--compare-baseline", "--training.steps=2", f"--job.run_dir={tmp_path / 'cmp'}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "pip install 'titan-core[plot]'" in err and "nothing was trained" in err
    assert not (tmp_path / "cmp").exists()
