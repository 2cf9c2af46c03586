"""Malformed inputs through the real CLI: each is one clear message, a documented exit code, no damage.

Every case runs ``python -m titan_core`` in a subprocess against its own copy of
a run folder that already holds a good run (config, metrics, two checkpoints),
and asserts: the exit code, a message fragment naming the culprit, no Python
traceback, and that no file that existed in the run folder changed (path, size,
mtime and SHA-1). ``pytest -s`` prints the table of (case, exit code, message).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from conftest import REPO, CliResult, run_cli

SMALL = (
    "--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=2", "--training.seq_len=32",
    "--training.local_batch_size=4", "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=2",
    "--checkpoint.enable=true", "--checkpoint.interval=2", "--checkpoint.keep_latest_k=0",
)
LAST = "checkpoints/step-000004"
TABLE: list[tuple[str, int, str]] = []


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]  # "{run}" and "{inputs}" are filled in
    fragment: str  # must appear in the message
    code: int = 2
    damage: Callable[[Path], None] | None = None  # applied to the run folder copy before the snapshot
    small: bool = True  # prepend the SMALL flags (spec, flavor, shapes, checkpoint settings)


def truncate_shard(run: Path) -> None:
    shard = run / LAST / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def corrupt_identity(run: Path) -> None:
    (run / LAST / "titan_checkpoint.json").write_text('{"format": 1, "step": ', encoding="utf-8")


def garbage_index(run: Path) -> None:
    (run / LAST / "tensor_index.json").write_bytes(b"\x80\x04garbage, not JSON" * 8)


def drop_index(run: Path) -> None:
    (run / LAST / "tensor_index.json").unlink()


def flip_shard_byte(run: Path) -> None:
    shard = run / LAST / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def add_blocker(run: Path) -> None:
    (run / "blocker").write_text("a regular file, not a folder\n", encoding="utf-8")


CASES = [
    # ---- configuration ------------------------------------------------------------------------
    Case("unknown section", ("--trainng.steps=5",), 'unknown section "trainng". Did you mean "training"?'),
    Case("unknown key", ("--training.stepz=5",), 'unknown key "training.stepz". Did you mean "steps"?'),
    Case("wrong type", ("--training.steps=many",), "training.steps: Input should be a valid integer"),
    Case("negative steps", ("--training.steps=-3",), "training.steps: Input should be greater than 0 (got -3)"),
    Case("literal out of choices", ("--training.dtype=float16",), "training.dtype: Input should be 'auto', 'float32' or 'bfloat16'"),
    Case("TOML syntax error", ("--config", "{inputs}/syntax.toml"), "TOML syntax error"),
    Case("binary file as --config", ("--config", "{inputs}/binary.toml"), "not a text file"),
    Case("unknown key in TOML", ("--config", "{inputs}/unknown_key.toml"), 'unknown key "training.stepz"'),
    Case("missing --config file", ("--config", "{inputs}/missing.toml"), "no such file"),
    Case("config function returns int", ("--config", "hostile_config:number"), "returned int"),
    Case("config function raises", ("--config", "hostile_config:broken"), "the config function raised RuntimeError"),
    Case("config module missing", ("--config", "no_such_module_xyz:fn"), "module 'no_such_module_xyz' could not be imported"),
    # ---- flags --------------------------------------------------------------------------------
    Case("flag value missing", ("--training.steps",), "--training.steps needs a value"),
    Case("stray argument", ("stray",), "unrecognised argument 'stray'"),
    Case("non-integer --nproc-per-node", ("--nproc-per-node", "two"), "--nproc-per-node: invalid int value"),
    # ---- plugins and layouts ------------------------------------------------------------------
    Case("unknown spec", ("--spec", "nosuchspec"), 'unknown spec "nosuchspec". Installed specs: llama3', small=False),
    Case("unknown flavor", ("--flavor", "huge"), 'spec "llama3" has no flavor "huge"'),
    Case("unknown converter", ("--converters", "nosuchconv"), 'unknown converter "nosuchconv"'),
    Case("duplicate converters", ("--converters", "float8,float8"), 'converter "float8" is listed twice'),
    Case("world size does not fit", ("--nproc-per-node", "2", "--parallelism.tp=4"), "tp=4 x pp=1 = 4 does not divide world size 2"),
    # ---- data and tokenizer paths -------------------------------------------------------------
    Case("nonexistent data source", ("--data.source={inputs}/nope.txt",), 'nope.txt" does not exist'),
    Case("empty data file", ("--data.source={inputs}/empty.txt",), "contains no documents"),
    Case("binary data file", ("--data.source={inputs}/binary.txt",), "binary.txt is not UTF-8 text"),
    Case(".csv data file", ("--data.source={inputs}/table.csv",), 'unsupported extension ".csv"'),
    Case("jsonl without the text field", ("--data.source={inputs}/other_field.jsonl",), 'other_field.jsonl has no field "text" (its fields: body)'),
    Case("tokenizer in the wrong format", ("--data.tokenizer={inputs}/words.model",), "words.model: line 1 is not '<base64 token> <rank>'"),
    Case("nonexistent tokenizer", ("--data.tokenizer={inputs}/nope.model",), "nope.model does not exist"),
    # ---- checkpoints (a run starts; the resume is refused) -----------------------------------
    Case("resume path missing tensor_index.json", ("--training.steps=6", "--checkpoint.resume=step-000004"),
         "is not a complete checkpoint: missing tensor_index.json", damage=drop_index),
    Case("resume path that does not exist", ("--training.steps=6", "--checkpoint.resume={run}/checkpoints/step-000099"),
         "is not a complete checkpoint: missing the folder"),
    Case("truncated shard", ("--training.steps=6",), "(truncated or overwritten)", damage=truncate_shard),
    Case("flipped byte in a shard", ("--training.steps=6",), "does not match its recorded CRC-32", damage=flip_shard_byte),
    Case("corrupt titan_checkpoint.json", ("--training.steps=6",), "titan_checkpoint.json is unreadable or corrupt",
         damage=corrupt_identity),
    Case("garbage tensor_index.json", ("--training.steps=6",), "tensor_index.json is 152 bytes but was written with",
         damage=garbage_index),
    Case("checkpoint of another model", ("--training.steps=6", "--llama3.n_layers=3"),
         "does not fit this model: parameter 'layers.2.attention.wk.weight' (shape [256, 256]) exists in this model"),
    Case("unwritable checkpoint folder", ("--training.steps=6", "--checkpoint.folder=blocker/ckpt"),
         "cannot create the checkpoint folder", damage=add_blocker),
]


# ---- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 4-step run with checkpoints at steps 2 and 4."""
    run = tmp_path_factory.mktemp("good") / "run"
    result = run_cli(*SMALL, "--training.steps=4", f"--job.run_dir={run}")
    assert result.code == 0, result.text
    assert (run / LAST / "tensor_index.json").is_file() and (run / "checkpoints" / "step-000002").is_dir()
    return run


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "syntax.toml").write_text("[training\nsteps = 3\n", encoding="utf-8")
    (folder / "binary.toml").write_bytes(bytes(range(256)) * 4)
    (folder / "unknown_key.toml").write_text("[training]\nstepz = 3\n", encoding="utf-8")
    (folder / "hostile_config.py").write_text(
        "def number():\n    return 42\n\n\ndef broken():\n    raise RuntimeError('boom')\n", encoding="utf-8")
    (folder / "empty.txt").write_bytes(b"")
    (folder / "binary.txt").write_bytes(bytes(range(256)) * 64)
    (folder / "table.csv").write_text("id,text\n1,hello world\n2,more text\n", encoding="utf-8")
    (folder / "other_field.jsonl").write_text('{"body": "hello"}\n{"body": "world"}\n', encoding="utf-8")
    (folder / "words.model").write_text("hello world\nthis is not a tiktoken ranks file\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module", autouse=True)
def print_table() -> object:
    yield
    width = max((len(name) for name, _, _ in TABLE), default=10)
    print("\n\n| input | exit code | message (first line) |\n|---|---|---|")
    for name, code, message in TABLE:
        print(f"| {name:<{width}} | {code} | {message.replace('|', '/')} |")


def snapshot(folder: Path) -> dict[str, tuple[int, int, str]]:
    """path -> (size, mtime_ns, sha1) of every file under ``folder``."""
    out: dict[str, tuple[int, int, str]] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            stat = path.stat()
            out[str(path.relative_to(folder))] = (stat.st_size, stat.st_mtime_ns, hashlib.sha1(path.read_bytes()).hexdigest())
    return out


def first_error_line(result: CliResult) -> str:
    """The error line; a heading ending in ':' (e.g. "invalid configuration:") with its first detail."""
    lines = [line.strip() for line in result.text.splitlines()]
    for i, line in enumerate(lines):
        if "error:" in line:
            return f"{line} {lines[i + 1]}" if line.endswith(":") and i + 1 < len(lines) else line
    return lines[0] if lines else ""


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_one_clear_error_and_changes_nothing(case: Case, good_run: Path, inputs: Path,
                                                              tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    if case.damage is not None:
        case.damage(run)
    before = snapshot(run)
    args = [a.format(run=run, inputs=inputs) for a in case.args]
    result = run_cli(*(SMALL if case.small else ()), f"--job.run_dir={run}", *args,
                     env={"PYTHONPATH": os.pathsep.join([str(REPO), str(inputs)])}, timeout=300)
    TABLE.append((case.id, result.code, first_error_line(result)))

    assert result.code == case.code, result.text
    assert case.fragment in result.text, f"{case.fragment!r} not in:\n{result.text}"
    assert "Traceback" not in result.text, result.text
    errors = [line for line in result.err.splitlines() if "error:" in line]
    assert len(errors) == 1, result.text  # one message, not a cascade
    after = snapshot(run)
    changed = {name: (before[name], after.get(name)) for name in before if after.get(name) != before[name]}
    assert not changed, changed
