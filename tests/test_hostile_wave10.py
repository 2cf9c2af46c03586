"""Hostile inputs, wave 10: float literals below even float64's range (``lr = 1e-400`` parsed to 0.0 and
trained with a zero learning rate without a word), and a TrainSpec whose ``name`` differs from the name it is
registered under (its config section is ``[TrainSpec.name]``: a spec calling itself "training" replaced the core's
[training] section; any other difference left ``--NAME.KEY`` an unknown section with no hint why).

Each case runs ``titan-train``'s ``main`` in this process. ``pytest -s`` prints the table of (case, exit code,
message).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path

import hostile_harness as harness
import pytest
import tomllib

from titan_core import register_train_spec
from titan_core.config.finite import UnderflowedFloat, parse_toml_float
from titan_core.plugin.discovery import load_train_spec

from conftest import CliResult

TABLE: list[tuple[str, int, str]] = []
table = harness.table_printer(TABLE, "input (wave 10)")
DRY = ("--spec", "llama3", "--flavor", "debugmodel", "--training.seq_len=32", "--training.local_batch_size=2",
       "--dry-run")
UNDERFLOW = "too small for any float (it reads as 0, not as the value written)"


def titan_train(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, case: str,
                *args: str) -> CliResult:
    harness.isolate(monkeypatch)
    result = harness.run_in_process(capsys, *args)
    TABLE.append((case, result.code, harness.first_error_line(result)))
    return result


# ---- float literals that underflow to 0 ----------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "shown"), [
    ("--optimizer.lr=1e-400", "optimizer.lr = 1e-400"),
    ("--optimizer.betas=0.9,1e-999", "optimizer.betas[1] = 1e-999"),
    ("--llama3.norm_eps=2.5E-350", "llama3.norm_eps = 2.5E-350"),  # a plugin's section, upper-case exponent
])
def test_a_flag_whose_float_underflows_to_zero_is_refused(flag: str, shown: str, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: Python read the literal as 0.0, which the float32 range check accepts, and the run trained with it."""
    result = titan_train(capsys, monkeypatch, f"{flag} (was read as 0.0)", *DRY, flag)
    harness.assert_one_clean_error(result, f"{shown}: {UNDERFLOW}")
    assert "Set a larger value, or 0." in result.text


def test_a_config_file_float_that_underflows_is_refused(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "tiny_lr.toml"
    config.write_text("[optimizer]\nlr = 1e-400\nweight_decay = 0.0\n")
    result = titan_train(capsys, monkeypatch, "TOML lr = 1e-400", *DRY, "--config", str(config))
    harness.assert_one_clean_error(result, f"optimizer.lr = 1e-400: {UNDERFLOW}")


@pytest.mark.parametrize("flag", ["--optimizer.weight_decay=0e-400", "--optimizer.weight_decay=0.0",
                                  "--optimizer.weight_decay=-0.0", "--optimizer.lr=1_0e-4"])
def test_zero_written_as_zero_still_passes(flag: str, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    result = titan_train(capsys, monkeypatch, flag, *DRY, flag)
    assert result.code == 0, result.text
    assert "dry run: configuration valid" in result.text


def test_the_toml_float_reader_marks_only_non_zero_literals() -> None:
    marked = tomllib.loads("a = 1e-400\nb = -9.5e-330\nc = 0e-999\nd = 0.000\ne = 1.5\nf = inf\ng = 1e-45",
                           parse_float=parse_toml_float)
    assert isinstance(marked["a"], UnderflowedFloat) and marked["a"] == 0.0 and repr(marked["a"]) == "1e-400"
    assert isinstance(marked["b"], UnderflowedFloat) and repr(marked["b"]) == "-9.5e-330"
    assert [type(marked[k]) for k in "cdefg"] == [float] * 5
    assert (marked["c"], marked["d"], marked["e"], marked["g"]) == (0.0, 0.0, 1.5, 1e-45) and math.isinf(marked["f"])


# ---- a TrainSpec whose name is not the one it is registered under ---------------------------------------------


def _register_llama3_as(registered: str, own_name: str) -> None:
    register_train_spec(dataclasses.replace(load_train_spec("llama3"), name=own_name), name=registered)


def test_a_spec_calling_itself_a_core_section_is_refused(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: its model's section replaced the core's [training], so every --training.* flag was an unknown key
    of the model ("unknown key training.steps. Keys of [training]: norm_eps, max_seq_len, ...")."""
    _register_llama3_as("outer_spec", "training")
    result = titan_train(capsys, monkeypatch, 'TrainSpec.name "training" (shadowed [training])', "--spec",
                         "outer_spec", *DRY[2:])
    harness.assert_one_clean_error(
        result, 'spec "outer_spec" (its TrainSpec.name) is named "training", which is also the name of a core config '
                'section ([training])')
    assert 'Set TrainSpec.name to "outer_spec"' in result.text


def test_a_spec_whose_own_name_differs_trains_and_says_where_its_section_is(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept working (a plugin written that way keeps running, as the API policy promises), with one line naming
    the section its settings live in."""
    _register_llama3_as("outer_spec", "inner_spec")
    result = titan_train(capsys, monkeypatch, "TrainSpec.name differs (silent before)", "--spec", "outer_spec",
                         *DRY[2:], "--inner_spec.n_layers=1")
    assert result.code == 0, result.text
    warning = ('warning: spec "outer_spec" calls itself "inner_spec" (TrainSpec.name), so its config section is '
               '[inner_spec] (--inner_spec.KEY=VALUE), not [outer_spec]; set TrainSpec.name = "outer_spec"')
    assert result.text.count(warning) == 1, result.text
    assert "dry run: configuration valid" in result.text


def test_a_spec_with_a_non_string_name_is_refused(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _register_llama3_as("outer_spec", 7)  # type: ignore[arg-type]
    result = titan_train(capsys, monkeypatch, "TrainSpec.name = 7", "--spec", "outer_spec", *DRY[2:])
    harness.assert_one_clean_error(result, 'spec "outer_spec": TrainSpec.name is 7; it must be a non-empty string')


# ---- titan-plugin: a new plugin named like an installed one, --flag values that are not flags ----------------


def plugin_tool(capsys: pytest.CaptureFixture[str], case: str, *args: str) -> CliResult:
    from titan_core.commands.titan_plugin import main

    result = harness.tool(capsys, main, *args)
    TABLE.append((f"titan-plugin {case}", result.code, harness.first_error_line(result)))
    return result


@pytest.mark.parametrize(("kind", "name", "owner", "what"), [
    ("converter", "float8", "titan-float8", "converter"),
    ("spec", "llama3", "titan-llama", "spec"),
    ("spec", "mx", "titan-mx-prototype", "converter"),  # the other kind: the config section [mx] is shared
])
def test_new_refuses_the_name_of_an_installed_plugin(kind: str, name: str, owner: str, what: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Before: it wrote the package; installed, it made two distributions claim the name and neither loaded."""
    result = plugin_tool(capsys, f"new {kind} {name}", "new", kind, name, "--dir", str(tmp_path / "pkg"))
    harness.assert_one_clean_error(result, f'a {what} named "{name}" is already installed ({owner} ')
    assert f'Choose another name, e.g. "my_{name}".' in result.text
    assert not (tmp_path / "pkg").exists()


def test_new_still_writes_a_free_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = plugin_tool(capsys, "new converter my_float8", "new", "converter", "my_float8", "--dir",
                         str(tmp_path / "pkg"))
    assert result.code == 0, result.text
    assert (tmp_path / "pkg" / "pyproject.toml").is_file()


@pytest.mark.parametrize(("flags", "shown"), [(("--flag", "x=1"), "'x=1'"), (("--flag=--",), "'--'")])
def test_check_refuses_a_flag_value_that_is_not_a_flag_before_any_check(
        flags: tuple[str, ...], shown: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the quick checks passed and the first training run failed on it ("unrecognised argument 'x=1'")."""
    result = plugin_tool(capsys, f"check {' '.join(flags)}", "check", "float8", "--fast", *flags)
    harness.assert_one_clean_error(result, f"--flag {shown}: not a titan-train flag; give one --SECTION.KEY=VALUE "
                                           f"per --flag, e.g. --flag --training.steps=10.")
    assert "import" not in result.text.split("error:")[0]  # refused before the first check ran


def test_check_takes_the_flag_form_its_help_shows() -> None:
    """``--flag --training.steps=5`` (the help's own form) was "argument --flag: expected one argument"."""
    from titan_core.commands.titan_plugin import _flag_values_joined, build_parser

    argv = _flag_values_joined(["check", "float8", "--flag", "--training.steps=5", "--flag", "--data.seed=3"])
    args = build_parser().parse_args(argv)
    assert args.flags == ["--training.steps=5", "--data.seed=3"]
    assert args.names == ["float8"]


# ---- a --config function that never returns ----------------------------------------------------------------


@pytest.mark.parametrize(("body", "what"), [
    ("def config():\n    time.sleep(3600)\n", "the config function"),
    ("time.sleep(3600)\n\ndef config():\n    return {}\n", "importing wave10_hang"),  # the module's import hangs
    # it catches what interrupts it and goes on sleeping: the alarm's exception is a BaseException, not an Exception
    ("def config():\n    while True:\n        try:\n            time.sleep(3600)\n        except Exception:\n"
     "            pass\n", "the config function"),
])
def test_a_config_function_that_never_returns_is_stopped_with_a_message(
        body: str, what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: titan-train waited for ever, printing nothing (on every rank of a launched job)."""
    from titan_core.config import layers

    (tmp_path / "wave10_hang.py").write_text("import time\n\n" + body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "wave10_hang", raising=False)
    monkeypatch.setattr(layers, "USER_CODE_TIMEOUT_S", 1.0)
    started = time.monotonic()
    result = titan_train(capsys, monkeypatch, f"--config fn that hangs ({what})", *DRY,
                         "--config", "wave10_hang:config")
    assert time.monotonic() - started < 30
    harness.assert_one_clean_error(result, f"--config wave10_hang:config: {what} did not return within 1 s: it hangs "
                                           f"(waiting on input, a lock or the network?). Fix it so that it returns")
