"""A third hostile survey: kinds of input the first two (test_hostile_inputs.py, test_hostile_checkpoints.py)
do not try.

Hostile TOML (deep nesting, duplicate keys, BOM, Latin-1, dates, arrays of tables), config
functions that return the wrong type or raise odd exceptions, numbers torch cannot hold,
launcher environment garbage, data files that are garbage in new ways, checkpoints whose
index or record is forged in new ways (re-digested so only the new check can catch them),
and plugins that raise BaseException subclasses, SystemExit, MemoryError or RecursionError,
or return the wrong type. Every case runs the CLI's ``main`` in this process against its
own copy of a finished run and asserts: the exit code, the message, one error line, no
traceback, and that every file that existed before is byte-identical afterwards.
``pytest -s`` prints the table.
"""

from __future__ import annotations

import json
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hostile_harness import (
    LAST,
    HostileCase as Case,
    assert_one_clean_error,
    assert_unchanged,
    damaged_copy,
    error_lines,
    isolate,
    run_in_process,
    signals_restored,
    small,
    snapshot,
    table_printer,
)

from conftest import run_main

SMALL = small(n_layers=1, batch=2, warmup=1)
PLUGINS = ("--import", "_survey_plugins")
FRESH = "--job.run_dir={fresh}"
TABLE: list[tuple[str, int, str]] = []


# ---- inputs written once --------------------------------------------------------------------------

def write_inputs(folder: Path) -> None:
    deep = "a = " + "[" * 5000 + "]" * 5000 + "\n"
    files: dict[str, bytes] = {
        "deep.toml": deep.encode(),
        "dupkey.toml": b"[training]\nsteps = 3\nsteps = 4\n",
        "bom.toml": "\ufeff[training]\nstepz = 1\n".encode("utf-8"),
        "latin1.toml": "[job]\ndescription = \"caf\xe9\"\n".encode("latin-1"),
        "date.toml": b"[training]\nsteps = 1979-05-27\n",
        "array_tables.toml": b"[[training]]\nsteps = 3\n",
        "top_level_key.toml": b"steps = 3\n",
        "huge_int.toml": b"[training]\nseed = 100000000000000000000000\n",
        "string_float.toml": b"[optimizer]\nlr = \"1e39\"\n",
        "nul.toml": b"[training]\nsteps = 3\x00\n",
        "lines.jsonl": b'[1, 2]\n"just a string"\nnull\n',
        "number_text.jsonl": b'{"text": 42}\n{"text": 43}\n',
        "object.json": b'{"text": "a single object, not a list of documents"}',
        "garbage.parquet": bytes(range(256)) * 8,
        "truncated.jsonl": b'{"text": "hello"}\n{"text": "wor',
        "nul_text.txt": b"hello\x00world\n" * 10,
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    empty_shards = folder / "empty_shards"
    empty_shards.mkdir()
    for i in range(3):
        (empty_shards / f"shard{i}.txt").write_bytes(b"")
    mixed = folder / "mixed"
    mixed.mkdir()
    (mixed / "good.txt").write_text("hello world\n" * 50)
    (mixed / "bad.txt").write_bytes(b"\xff\xfe\x00garbage" * 40)
    unsupported = folder / "unsupported"
    unsupported.mkdir()
    (unsupported / "notes.md").write_text("# not a data file\n")


# ---- checkpoint forgeries (re-digested: only the new check can catch them) -----------------------------

def redigest(folder: Path) -> None:
    """Rewrite the identity record's manifest so the sizes and CRC-32s match the files as they now are."""
    record_path = folder / "titan_checkpoint.json"
    record = json.loads(record_path.read_text())
    for name in list(record["files"]):
        data = (folder / name).read_bytes()
        record["files"][name] = {"size": len(data), "crc32": zlib.crc32(data)}
    record_path.write_text(json.dumps(record))


def edit_index_text(edit: Callable[[str], str]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        path = run / LAST / "tensor_index.json"
        path.write_text(edit(path.read_text()))
        redigest(run / LAST)
    return damage


def duplicate_tensor_key(text: str) -> str:
    """A second "model.norm.weight" entry after the first: plain json.loads keeps only the last one."""
    index = json.loads(text)
    entry = json.dumps(index["tensors"]["model.norm.weight"])
    forged = dict(index["tensors"]["model.norm.weight"], dtype="float16")
    return text.replace('"model.norm.weight":' + entry.replace(" ", ""),
                        '"model.norm.weight":' + entry.replace(" ", "") + ',"model.norm.weight":'
                        + json.dumps(forged).replace(" ", ""), 1)


def edit_record(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        path = run / LAST / "titan_checkpoint.json"
        record = json.loads(path.read_text())
        edit(record)
        path.write_text(json.dumps(record))
    return damage


def record_duplicate_step(run: Path) -> None:
    path = run / LAST / "titan_checkpoint.json"
    text = path.read_text()
    path.write_text(text.replace('"step": 4', '"step": 4, "step": 2', 1).replace('"step":4', '"step":4,"step":2', 1))


def negative_offset(ix_text: str) -> str:
    index = json.loads(ix_text)
    index["tensors"]["model.norm.weight"]["chunks"][0]["offset"] = -8
    return json.dumps(index)


def unicode_file_name(ix_text: str) -> str:
    index = json.loads(ix_text)
    index["tensors"]["model.norm.weight"]["chunks"][0]["file"] = "__0_0.distcp\u200b"
    return json.dumps(index)


def unicode_tensor_name(ix_text: str) -> str:
    index = json.loads(ix_text)
    index["tensors"]["model.norm.weight\u200b"] = index["tensors"].pop("model.norm.weight")
    return json.dumps(index)


def index_is_a_list(ix_text: str) -> str:
    return json.dumps([json.loads(ix_text)])


def huge_dims(ix_text: str) -> str:
    index = json.loads(ix_text)
    entry = index["tensors"]["model.norm.weight"]
    entry["size"] = [2**62, 2**62]
    entry["chunks"][0].update(offsets=[0, 0], sizes=[2**62, 2**62])
    return json.dumps(index)


def truncated_index(run: Path) -> None:
    path = run / LAST / "tensor_index.json"
    path.write_bytes(path.read_bytes()[:100])
    redigest(run / LAST)


def step_folder(name: str, *, kind: str = "copy") -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        target = run / "checkpoints" / name
        if kind == "file":
            target.write_text("not a checkpoint\n")
        else:
            shutil.copytree(run / LAST, target)
    return damage


def checkpoints_is_a_file(run: Path) -> None:
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").write_text("a file where the checkpoint folder belongs\n")


CASES = [
    # ---- hostile TOML ---------------------------------------------------------------------------------
    Case("TOML nested 5000 deep", ("--config", "{inputs}/deep.toml"), "the TOML nests arrays or tables too deeply"),
    Case("TOML duplicate key", ("--config", "{inputs}/dupkey.toml"), "TOML syntax error"),
    Case("TOML with a UTF-8 BOM (read like any TOML)", ("--config", "{inputs}/bom.toml"), 'unknown key "training.stepz"'),
    Case("TOML in Latin-1", ("--config", "{inputs}/latin1.toml"), "not a text file (it is not UTF-8)"),
    Case("TOML date where an int belongs", ("--config", "{inputs}/date.toml"), "training.steps"),
    Case("TOML array of tables for a section", ("--config", "{inputs}/array_tables.toml"), "training"),
    Case("TOML key outside any section", ("--config", "{inputs}/top_level_key.toml"), '"steps"'),
    Case("TOML int beyond 64 bits", ("--config", "{inputs}/huge_int.toml"), "training.seed = 100000000000000000000000: does not fit in a 64-bit integer"),
    Case("TOML string float beyond float32", ("--config", "{inputs}/string_float.toml"), "optimizer.lr = 1e+39: too large for float32"),
    Case("TOML with a NUL byte", ("--config", "{inputs}/nul.toml"), "TOML syntax error"),
    # ---- numbers torch cannot hold ---------------------------------------------------------------------
    Case("lr beyond float32", ("--optimizer.lr=1e39",), "optimizer.lr = 1e+39: too large for float32"),
    Case("weight decay beyond float32", ("--optimizer.weight_decay=1e300",), "optimizer.weight_decay = 1e+300: too large for float32"),
    Case("eps below float32", ("--optimizer.eps=1e-50",), "optimizer.eps = 1e-50: too small for float32"),
    Case("seed beyond int64", ("--training.seed=18446744073709551616",), "does not fit in a 64-bit integer"),
    Case("steps beyond int64", ("--training.steps=99999999999999999999999",), "training.steps = 99999999999999999999999: does not fit"),
    Case("plugin value beyond int64", ("--llama3.vocab_size=99999999999999999999",), "llama3.vocab_size"),
    # ---- config functions -----------------------------------------------------------------------------
    Case("config function returns a list", ("--config", "_survey_plugins:returns_list"), "returned list"),
    Case("config function returns None", ("--config", "_survey_plugins:returns_none"), "returned NoneType"),
    Case("config function returns a generator", ("--config", "_survey_plugins:returns_generator"), "returned generator"),
    Case("config function: section is an int", ("--config", "_survey_plugins:returns_section_as_int"), "training"),
    Case("config function: non-string keys", ("--config", "_survey_plugins:returns_non_str_keys"), "training"),
    Case("config function: self-referencing dict", ("--config", "_survey_plugins:returns_self_referencing"), "contains itself"),
    Case("config function raises MemoryError", ("--config", "_survey_plugins:raises_memory_error"), "the config function raised MemoryError"),
    Case("config function recurses forever", ("--config", "_survey_plugins:recurses"), "the config function raised RecursionError"),
    Case("config function raises a BaseException subclass", ("--config", "_survey_plugins:raises_base_exception"),
         "the config function raised OddStop"),
    # ---- environment ------------------------------------------------------------------------------------
    Case("LOCAL_WORLD_SIZE garbage", (FRESH,), "environment variable LOCAL_WORLD_SIZE='many' is not an integer >= 1",
         env=(("LOCAL_WORLD_SIZE", "many"),)),
    Case("WORLD_SIZE beyond int64", (), "WORLD_SIZE='99999999999999999999999' is not an integer up to 16777216",
         env=(("WORLD_SIZE", "99999999999999999999999"),)),
    Case("RANK beyond any job", ("--parallelism.dp_shard=2", FRESH), "RANK='4294967296' is not an integer up to",
         env=(("WORLD_SIZE", "2"), ("RANK", "4294967296"))),
    Case("TITAN_LAUNCHER_PID garbage", (FRESH, "--training.stepz=1"), 'unknown key "training.stepz"',
         env=(("TITAN_LAUNCHER_PID", "x" * 10000), ("TITAN_LAUNCHER_ERRORS", "/"))),
    # ---- data ---------------------------------------------------------------------------------------------
    Case("jsonl lines that are not objects", ("--data.source={inputs}/lines.jsonl", FRESH), "lines.jsonl"),
    Case("jsonl text field not a string", ("--data.source={inputs}/number_text.jsonl", FRESH), "number_text.jsonl"),
    Case(".json holding one object", ("--data.source={inputs}/object.json", FRESH), "object.json"),
    Case("garbage .parquet", ("--data.source={inputs}/garbage.parquet", FRESH), "garbage.parquet"),
    Case("jsonl cut mid-record", ("--data.source={inputs}/truncated.jsonl", FRESH), "truncated.jsonl"),
    Case("folder of zero-length shards", ("--data.source={inputs}/empty_shards", FRESH), "contains no documents"),
    Case("folder with one non-UTF-8 file", ("--data.source={inputs}/mixed", FRESH), "bad.txt is not UTF-8 text"),
    Case("folder with no data file", ("--data.source={inputs}/unsupported", FRESH), "unsupported"),
    # ---- checkpoints ------------------------------------------------------------------------------------
    Case("index with a duplicate tensor key", ("--training.steps=6",), "the key 'model.norm.weight' appears twice in one JSON object",
         damage=edit_index_text(duplicate_tensor_key)),
    # auto-resume ignores an untrusted step folder with a message, resumes from the one before, and keeps the
    # ignored folder aside instead of saving over it
    Case("record with a duplicate key", ("--training.steps=6",), "the key 'step' appears twice in one JSON object",
         damage=record_duplicate_step),
    Case("record step beyond int64", ("--training.steps=6",), "its identity file records step 1000000000000000000000000000000",
         damage=edit_record(lambda r: r.update(step=10**30)), code=0),
    Case("record manifest size beyond int64", ("--training.steps=6",), "bytes but was written with 1000000000000000000000000000000",
         damage=edit_record(lambda r: r["files"]["__0_0.distcp"].update(size=10**30))),
    Case("index truncated and re-digested", ("--training.steps=6",), "tensor_index.json is unreadable", damage=truncated_index),
    Case("negative chunk offset", ("--training.steps=6",), "offset and length must be non-negative integers",
         damage=edit_index_text(negative_offset)),
    Case("zero-width space in a file name", ("--training.steps=6",), "is not a plain file name",
         damage=edit_index_text(unicode_file_name)),
    Case("zero-width space in a tensor name", ("--training.steps=6",), "model.norm.weight",
         damage=edit_index_text(unicode_tensor_name)),
    Case("index is a JSON list", ("--training.steps=6",), "tensor_index.json is unreadable", damage=edit_index_text(index_is_a_list)),
    Case("2^124-element tensor declared", ("--training.steps=6",), "model.norm.weight", damage=edit_index_text(huge_dims)),
    Case("checkpoint folder is a file", ("--training.steps=6",), "checkpoints", damage=checkpoints_is_a_file),
    Case("step folder named step-0000-1", ("--training.steps=6",), "step-000004 at step 4", damage=step_folder("step-0000-1"), code=0),
    Case("step folder that is a file", ("--training.steps=6",), "", damage=step_folder("step-000008", kind="file"), code=0),
    Case("resume= names a path outside", ("--training.steps=6", "--checkpoint.resume=../../etc"), "is not a complete checkpoint"),
    # ---- plugins ------------------------------------------------------------------------------------------
    Case("convert() raises a BaseException subclass", (*PLUGINS, "--converters", "odd_base", "--dry-run"),
         'converter "odd_base" (<registered in _survey_plugins>) failed in convert(): OddStop'),
    Case("convert() calls sys.exit(0)", (*PLUGINS, "--converters", "odd_exit", "--dry-run"), "failed in convert(): SystemExit"),
    Case("convert() raises MemoryError", (*PLUGINS, "--converters", "odd_memory", "--dry-run"),
         "out of memory in convert() of converter \"odd_memory\" (<registered in _survey_plugins>)"),
    Case("convert() returns a converted copy", (*PLUGINS, "--converters", "odd_returns_copy", "--dry-run"),
         'converter "odd_returns_copy" (<registered in _survey_plugins>) returned a Transformer from convert() '
         "instead of rewriting the model in place"),
    Case("select() recurses forever", (*PLUGINS, "--converters", "odd_recursion", "--dry-run"), "failed in select(): RecursionError"),
    Case("select() returns an int", (*PLUGINS, "--converters", "odd_select_int", "--dry-run"),
         "failed in select(): TypeError: it returned int '42', not a list of module names"),
    Case("select() returns a string", (*PLUGINS, "--converters", "odd_select_str", "--dry-run"),
         "failed in select(): TypeError: it returned str"),
    Case("select() names a missing module", (*PLUGINS, "--converters", "odd_select_unknown", "--dry-run"), "no.such.module"),
    Case("compatible_with raises a BaseException subclass", (*PLUGINS, "--converters", "odd_compatible", "--dry-run"),
         "failed in compatible_with(): OddStop: compatible_with went wrong"),
    Case("plugin validator raises RuntimeError", (*PLUGINS, "--converters", "odd_validator", "--odd_validator.size=2", "--dry-run"),
         "the validator of section [odd_validator] raised RuntimeError: validator bug"),
    Case("parallelize_fn returns None", (*PLUGINS, "--spec", "odd_parallelize_none", "--odd_parallelize_none.n_layers=1", FRESH),
         "failed in parallelize_fn: TypeError: it returned NoneType, not the parallelized nn.Module", small=False),
    Case("model forward returns a tuple", (*PLUGINS, "--spec", "odd_forward_tuple", "--odd_forward_tuple.n_layers=1", FRESH),
         "failed in the model's forward: it returned tuple", small=False),
    Case("init_parameter raises a BaseException subclass", (*PLUGINS, "--spec", "odd_init_base", "--odd_init_base.n_layers=1", FRESH),
         "failed in the model's init_parameter/init_buffers: OddStop", small=False),
]


# ---- fixtures -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from titan_core.commands.titan_train import main

    run = tmp_path_factory.mktemp("survey") / "run"
    with signals_restored():
        assert main([*SMALL, "--training.steps=4", f"--job.run_dir={run}"]) == 0
    assert (run / LAST / "tensor_index.json").is_file()
    return run


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("survey_inputs")
    write_inputs(folder)
    return folder


table = table_printer(TABLE, "input")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_one_clean_error(case: Case, good_run: Path, inputs: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    run = damaged_copy(good_run, tmp_path, case.damage)
    isolate(monkeypatch, case.env)
    before = snapshot(run)
    args = [a.format(run=run, inputs=inputs, fresh=tmp_path / "fresh") for a in case.args]
    result = run_in_process(capsys, *(SMALL if case.small else ()), f"--job.run_dir={run}", *args)
    errors = error_lines(result)
    TABLE.append((case.id, result.code, errors[0] if errors else result.text.strip().splitlines()[-1][:200]))
    if case.code == 0:  # a run that was right to go ahead: every checkpoint file it found is still there
        assert result.code == 0 and not errors and "Traceback" not in result.text, result.text
        assert case.fragment in result.text, f"{case.fragment!r} not in:\n{result.text}"
        after = snapshot(run)
        kept = {v[2] for k, v in after.items() if k.startswith("checkpoints/")}
        lost = [k for k, v in before.items() if k.startswith("checkpoints/") and v[2] not in kept]
        assert not lost, lost
        return
    assert_one_clean_error(result, case.fragment, case.code)
    assert_unchanged(before, run)


def test_dry_run_refuses_a_model_that_cannot_fit_with_the_run_s_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--dry-run makes the same pre-allocation memory check as the run, with the same words."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    huge = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.vocab_size=400000000", f"--job.run_dir={tmp_path}")
    dry = run_in_process(capsys, *huge, "--dry-run")
    real = run_in_process(capsys, *huge)
    lines = [error_lines(r) for r in (dry, real)]
    assert dry.code == real.code == 2, dry.text + real.text
    # the same message; only the free memory read at that moment (MemAvailable) may differ between the two
    assert len(lines[0]) == len(lines[1]) == 1, lines
    assert lines[0][0].split(" but only ")[0] == lines[1][0].split(" but only ")[0], lines
    assert "the model cannot fit: 204,805,115,136 parameters need at least 3,051.8 GiB per rank" in lines[0][0]
    assert "Traceback" not in dry.text + real.text


def test_a_constructor_refusal_from_torch_names_the_section(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The net behind the config checks: whatever torch's optimizer or scheduler constructor refuses is a
    config error naming [optimizer] / [lr_scheduler] and their values, exit 2, no traceback."""
    import torch

    from titan_core.optim import containers

    def refusing_adamw(params: object, **kwargs: object) -> torch.optim.Optimizer:
        raise ValueError(f"Invalid learning rate: {kwargs['lr']}")

    monkeypatch.setitem(containers._OPTIMIZERS, "AdamW", refusing_adamw)
    result = run_in_process(capsys, "--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1",
                            "--training.seq_len=32", "--training.local_batch_size=2", "--training.steps=1",
                            f"--job.run_dir={tmp_path}")
    assert_one_clean_error(result, "Invalid learning rate: 0.003. Fix the [optimizer] values")
    assert error_lines(result)[0].startswith(
        "titan-train: error: [optimizer] torch.optim.AdamW refused these settings (name='AdamW', lr=0.003")


def test_a_converter_that_also_returns_the_model_it_rewrote_in_place_is_accepted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Only a different object returned from convert() is refused (its conversion would be lost)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    result = run_main(capsys, *PLUGINS, "--spec", "llama3", "--converters", "odd_returns_input", "--dry-run",
                      f"--job.run_dir={tmp_path}")
    assert result.code == 0, result.text
    assert "layers.0.attention.wq" in result.text and "odd_returns_input" in result.text
