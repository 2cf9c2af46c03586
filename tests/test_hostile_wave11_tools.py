"""Hostile inputs, wave 11, the one-shot tools: ``titan-eval --output`` replaced any file with its JSON (a run's
config.toml, a checkpoint's tensor_index.json: the run could no longer be read); ``titan-data prepare`` dropped
every occurrence of a file listed twice (``a b a`` packed only b; ``a a`` "held no documents"); ``titan-plugin
check`` blamed the plugin for the user's --kind or --flag (a FAIL table and exit 1).

Each case runs the tool's ``main`` in this process. ``pytest -s`` prints the table of (case, exit code, message).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import hostile_harness as harness
import pytest

from conftest import CliResult

TABLE: list[tuple[str, int, str]] = []
table = harness.table_printer(TABLE, "input (wave 11, tools)")


def record(case: str, result: CliResult) -> None:
    TABLE.append((case, result.code, harness.first_error_line(result)))


# ---- titan-eval --output -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer llama3 debugmodel run of 2 steps, its checkpoint at step 2 (what titan-eval reads)."""
    from titan_core.commands.titan_train import main

    run = tmp_path_factory.mktemp("wave11") / "run"
    with harness.signals_restored():
        assert main([*harness.small(n_layers=1), "--training.steps=2", f"--job.run_dir={run}"]) == 0
    assert (run / "checkpoints/step-000002/tensor_index.json").is_file()
    return run


def titan_eval(capsys: pytest.CaptureFixture[str], run: Path, output: Path) -> CliResult:
    from titan_core.commands.evaluate import main as eval_main

    return harness.tool(capsys, eval_main, str(run), "--tasks", "builtin", "--limit", "2", "--output", str(output))


@pytest.mark.parametrize(("target", "said"), [
    ("config.toml", "already exists and is not a titan-eval results file"),
    ("metrics.jsonl", "already exists and is not a titan-eval results file"),
    ("checkpoints/step-000002/tensor_index.json", "a titan checkpoint"),
    ("checkpoints/step-000002/results.json", "a titan checkpoint"),  # new, but among the weights
    ("checkpoints/results.json", "a run's checkpoints folder"),
    (".", "is a folder"),
], ids=["config.toml", "metrics.jsonl", "tensor_index.json", "new file in a checkpoint", "new file in checkpoints/",
        "the run folder"])
def test_eval_output_never_replaces_a_run_s_own_files(target: str, said: str, tiny_run: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Before: exit 0 and the file was replaced by JSON (titan-generate then refused the run: TOML syntax error,
    or a tensor index of the wrong size); a folder or a new file among the weights was written to as well."""
    before = harness.snapshot(tiny_run)
    output = tiny_run / target
    result = titan_eval(capsys, tiny_run, output)
    record(f"titan-eval --output RUN/{target} (replaced, exit 0)", result)
    harness.assert_one_clean_error(result, f"titan-eval: error: --output {output}")
    assert said in result.text and ("give a new file" in result.text or "Give a new file" in result.text)
    assert result.out == ""  # refused before the model was loaded or scored
    harness.assert_unchanged(before, tiny_run)
    assert set(harness.snapshot(tiny_run)) == set(before)  # nothing new either


def test_eval_output_replaces_an_earlier_result_and_fills_an_empty_file(tiny_run: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The guard of the rule (passes before the change too): re-running to the same results path, or to an empty
    file (mktemp's), writes the figures there."""
    output = tmp_path / "eval.json"
    output.write_text(json.dumps({"eval/python_text/ppl": 1.5, "eval/python_text/examples": 2}, indent=1) + "\n")
    first = titan_eval(capsys, tiny_run, output)
    assert first.code == 0, first.text
    figures = json.loads(output.read_text())
    assert figures == json.loads(first.out) and "eval/python_syntax/acc" in figures
    again = titan_eval(capsys, tiny_run, output)
    assert again.code == 0 and json.loads(output.read_text()) == figures, again.text
    empty = tmp_path / "empty.json"
    empty.touch()
    assert titan_eval(capsys, tiny_run, empty).code == 0
    assert json.loads(empty.read_text()) == figures


def test_eval_output_refuses_a_json_file_that_is_not_a_result(tmp_path: Path, tiny_run: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Before: any JSON file was replaced (a tokenizer's config, a data set's index.json)."""
    output = tmp_path / "index.json"
    output.write_text('{"format": "titan-shards", "num_documents": 80}\n')
    data = output.read_bytes()
    result = titan_eval(capsys, tiny_run, output)
    record("titan-eval --output index.json of a data set (replaced, exit 0)", result)
    harness.assert_one_clean_error(result, "is not a titan-eval results file")
    assert output.read_bytes() == data


# ---- titan-data prepare: a file listed more than once ---------------------------------------------------------


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """a.jsonl (5 documents), b.jsonl (3), data/c.jsonl (4) and link.jsonl -> a.jsonl, with the cwd there."""
    for name, count in (("a.jsonl", 5), ("b.jsonl", 3), ("data/c.jsonl", 4)):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        lines = (json.dumps({"text": f"{name} document {i}: " + "word " * (i + 3)}) for i in range(count))
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    os.symlink("a.jsonl", tmp_path / "link.jsonl")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("sources", "documents", "repeats"), [
    (("a.jsonl", "b.jsonl", "a.jsonl"), 8, [False, False, True]),
    (("a.jsonl", "a.jsonl"), 5, [False, True]),
    (("./a.jsonl", "a.jsonl", "a.jsonl"), 5, [False, True, True]),
    (("data", "data/c.jsonl", "b.jsonl"), 7, [False, True, False]),
    (("data/c.jsonl", "data"), 4, [False, True]),
    (("link.jsonl", "a.jsonl", "link.jsonl"), 5, [False, True, True]),
], ids=["a b a", "a a", "./a a a", "folder then a file in it", "a file then its folder", "link a link"])
def test_prepare_reads_a_file_listed_twice_once(sources: tuple[str, ...], documents: int, repeats: list[bool],
                                                corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: every occurrence of a repeated path was skipped (``a b a`` packed b alone, exit 0); ``a a`` and a
    folder with a file inside it exited 2 with "the sources hold no documents"."""
    from titan_core.commands.data_prepare import main as data_main

    result = harness.tool(capsys, data_main, "prepare", "--tokenizer", "builtin", *sources, "--out", "out", "--quiet")
    record(f"titan-data prepare {' '.join(sources)} (every occurrence dropped)", result)
    assert result.code == 0 and "Traceback" not in result.text, result.text
    assert f"{documents} documents" in result.out
    skipped = [line for line in result.err.splitlines() if line.startswith("prepare: skipped")]
    repeated = {name for name, again in zip(sources, repeats) if again}  # ./a.jsonl and a.jsonl: one path
    assert len(skipped) == len(set(skipped)) == len({os.path.normpath(n) for n in repeated}), result.err  # once each
    index = json.loads((corpus / "out" / "index.json").read_text())
    assert index["num_documents"] == documents
    files = [f for source in index["inputs"]["sources"] for f in source["files"]]
    assert ["duplicate_of" in f for f in files] == repeats
    first = files[0]["path"]
    assert all(f["duplicate_of"] in {first, str((corpus / "a.jsonl").resolve())} for f in files if "duplicate_of" in f)


# ---- titan-plugin check: --kind and --flag are the user's -----------------------------------------------------


@pytest.mark.parametrize(("args", "said"), [
    (("float8", "--kind", "spec"), '--kind spec: "float8" is an installed converter, not a spec; check it with '
                                   "--kind converter"),
    (("llama3", "--kind", "converter"), '--kind converter: "llama3" is an installed spec, not a converter; check it '
                                        "with --kind spec"),
    (("nosuchplugin", "--kind", "spec"), 'no installed spec or converter is named "nosuchplugin"'),
    (("float8", "--flag", "--training.steps=0"), "--flag --training.steps=0: every training run of the checks would "
                                                 "refuse it: invalid configuration:\n  training.steps: Input should "
                                                 "be greater than 0"),
    (("float8", "--flag", "--float8.nosuch=1"), '--flag --float8.nosuch=1: every training run of the checks would '
                                                'refuse it: invalid configuration:\n  unknown key "float8.nosuch"'),
    (("llama3", "--flag", "--llama3.n_layers=0"), "--flag --llama3.n_layers=0: every training run of the checks would "
                                                  "refuse it: invalid configuration:\n  llama3.n_layers: Input should "
                                                  "be greater than 0"),
], ids=["converter as --kind spec", "spec as --kind converter", "--kind spec, not installed", "--flag core section",
        "--flag converter's section", "--flag spec's section"])
def test_a_check_s_kind_or_flag_that_does_not_fit_is_a_user_error(args: tuple[str, ...], said: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the checks ran and failed on it (the import row "unknown spec", or every training row the config
    error), "titan-plugin check: FAILED" and exit 1, as if the plugin were broken."""
    from titan_core.commands.titan_plugin import main as plugin_main

    result = harness.tool(capsys, plugin_main, "check", "--fast", *args)
    record(f"titan-plugin check {' '.join(args)} (FAIL rows, exit 1)", result)
    harness.assert_one_clean_error(result, f"titan-plugin: error: {said}")
    assert result.out == "" and "FAILED" not in result.text  # no table: nothing ran


def test_flag_values_the_config_takes_pass_the_pre_check() -> None:
    """The guard of the pre-check: values the config accepts (a core key, the converter's own, a spec chosen by
    --flag) raise nothing, so the checks run as before."""
    from titan_core.commands.plugin_check import check_flag_values, checked_kind

    assert checked_kind("float8", "converter") == "converter" and checked_kind("llama3", "spec") == "spec"
    check_flag_values({"float8": "converter"}, spec="tiny", flavor=None,
                      flags=["--training.steps=3", "--float8.emulate=true"], run_flags=["--model.plugin_timeout_s=300.0"])
    check_flag_values({"llama3": "spec"}, spec="tiny", flavor="debugmodel", flags=["--llama3.n_layers=1"])
