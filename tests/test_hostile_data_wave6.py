"""Hostile inputs to the data pipeline (wave 6): shard sets edited by hand, titan-data prepare's sources,
flags and ``--out`` records, and ``data.mix`` values. Each is one ``error:`` line naming the problem,
exit 2, no traceback, and no file that existed before changed.

Every case runs a CLI's ``main`` in this process (the same code path as the console scripts, without
an interpreter start-up): ``titan-train`` for shard sets and mixtures, ``titan-data`` for prepare.
The cases marked "guard" already passed before this wave; the others were found failing by the
survey (a traceback, a hang, exit 0 on an unusable result, or a message that blamed the wrong input).
``pytest -s`` prints the table of (case, exit code, message).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hostile_harness import (
    assert_one_clean_error,
    assert_unchanged,
    first_error_line,
    isolate,
    run_in_process,
    snapshot,
    table_printer,
)

from titan_core.commands.data_prepare import main as data_main

from conftest import CliResult

TABLE: list[tuple[str, int, str]] = []
table = table_printer(TABLE, "data input (wave 6)")
TRAIN = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.steps=1",
         "--training.seq_len=32", "--training.local_batch_size=2", "--metrics.report=false")
DEEP = "[" * 100_000 + "]" * 100_000  # nested past the JSON parser's recursion limit


def notes(n: int = 300) -> str:
    return "".join(json.dumps({"text": f"note {i}: the quick brown fox jumps over the lazy dog {i} times."}) + "\n"
                   for i in range(n))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished shard set of 300 short documents in shards of 2000 tokens, and its source."""
    base = tmp_path_factory.mktemp("prepared")
    (base / "notes.jsonl").write_text(notes(), encoding="utf-8")
    assert data_main(["prepare", str(base / "notes.jsonl"), "--tokenizer", "builtin", "--out", str(base / "good"),
                      "--shard-tokens", "2000", "--quiet"]) == 0
    return base


# ---- shard sets, read by titan-train ------------------------------------------------------------------


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _rewrite(folder: Path, edit: Callable[[dict[str, object]], None]) -> None:
    """Edit index.json and drop the mtime cache, so every file is hashed again (as after a copy)."""
    index = json.loads((folder / "index.json").read_text())
    edit(index)
    (folder / "index.json").write_text(json.dumps(index))
    (folder / ".verified.json").unlink(missing_ok=True)


def documents(offsets: list[int | None]) -> Callable[[Path], None]:
    """documents.bin replaced (and the index's hash of it updated): the hashes agree, the offsets do not.
    None stands for the stream's length."""
    def damage(folder: Path) -> None:
        end = json.loads((folder / "index.json").read_text())["num_tokens"]
        data = np.asarray([end if o is None else o for o in offsets], dtype="<i8").tobytes()
        (folder / "documents.bin").write_bytes(data)
        _rewrite(folder, lambda ix: (ix["documents"].update(sha256=_sha(data)),  # type: ignore[attr-defined]
                                     ix.update(num_documents=len(offsets) - 1)))
    return damage


def ids_beyond_vocab(folder: Path) -> None:
    """One shard of ids the builtin tokenizer (2048 ids) never gives, with a consistent index."""
    data = np.full(4000, 65000, dtype="<u2").tobytes()
    for shard in folder.glob("shard-*.bin"):
        shard.unlink()
    (folder / "shard-00000.bin").write_bytes(data)
    offsets = np.asarray([0, 2000, 4000], dtype="<i8").tobytes()
    (folder / "documents.bin").write_bytes(offsets)
    _rewrite(folder, lambda ix: ix.update(shards=[{"file": "shard-00000.bin", "tokens": 4000, "sha256": _sha(data)}],
                                          num_tokens=4000, num_documents=2,
                                          documents={"file": "documents.bin", "sha256": _sha(offsets)}))


def extra_shard(make: Callable[[Path], None], tokens: int) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        make(folder / "shard-00099.bin")

        def add(ix: dict[str, object]) -> None:
            ix["shards"].append({"file": "shard-00099.bin", "tokens": tokens, "sha256": _sha(b"")})  # type: ignore[attr-defined]
            ix["num_tokens"] = int(ix["num_tokens"]) + tokens  # type: ignore[call-overload]
        _rewrite(folder, add)
    return damage


def deep_index(folder: Path) -> None:
    (folder / "index.json").write_text(DEEP)


def index_list(folder: Path) -> None:
    (folder / "index.json").write_text("[]")


@dataclass(frozen=True)
class ShardCase:
    id: str
    damage: Callable[[Path], None] | None
    fragment: str
    args: tuple[str, ...] = ()
    source: str = "tokens:{shards}"


SHARD_CASES = [
    ShardCase("documents.bin offsets going backwards", documents([0, 5000, 100, None]),
              "documents.bin's offsets 0..3 are not increasing"),
    ShardCase("documents.bin offsets past the stream", documents([0, 99999, None]),
              "documents.bin's offsets 0..2 are not increasing"),
    ShardCase("documents.bin not starting at 0", documents([300, 600, None]),
              "documents.bin does not start at 0 and end at num_tokens"),
    ShardCase("token ids beyond the tokenizer's vocabulary", ids_beyond_vocab,
              "it holds token id 65000, outside the tokenizer's vocabulary of 2048 ids"),
    ShardCase("a named pipe as a shard (hung in the hash)", extra_shard(os.mkfifo, 0),
              "shard-00099.bin is not a regular file"),
    ShardCase("a folder as a shard", extra_shard(lambda p: p.mkdir(), 2048), "shard-00099.bin is not a regular file"),
    ShardCase("index.json nested too deeply to parse", deep_index, "index.json is not valid JSON (maximum recursion"),
    ShardCase("tokens: with no folder", None, 'data source "tokens:" names no folder', source="tokens:"),
    ShardCase("guard: index.json holds a list", index_list, "index.json is not a titan-data index"),
    ShardCase("guard: tokens: names a file", None, "is a regular file, not a folder", source="tokens:{base}/notes.jsonl"),
]


@pytest.mark.parametrize("case", SHARD_CASES, ids=[c.id for c in SHARD_CASES])
def test_a_damaged_shard_set_is_one_clean_error_and_changes_nothing(
        case: ShardCase, prepared: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    isolate(monkeypatch)
    shards = tmp_path / "shards"
    shutil.copytree(prepared / "good", shards)
    if case.damage is not None:
        case.damage(shards)
    before = snapshot(shards)
    result = run_in_process(capsys, *TRAIN, *case.args, f"--job.run_dir={tmp_path / 'run'}",
                            f"--data.source={case.source.format(shards=shards, base=prepared)}")
    TABLE.append((case.id, result.code, first_error_line(result)))
    assert_one_clean_error(result, case.fragment)
    assert_unchanged(before, shards)
    assert not (tmp_path / "run" / "checkpoints").exists()


# ---- titan-data prepare ----------------------------------------------------------------------------------


def prepare(capsys: pytest.CaptureFixture[str], *args: str) -> CliResult:
    code = data_main(["prepare", *args, "--quiet"])
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)


def write(path: Path, data: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")


def parquet_without_rows(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)


Setup = Callable[[Path, Path], None]  # (the case's folder, the prepared shard set's folder)


def unfinished(edit: Callable[[dict[str, object]], None]) -> Setup:
    """--out holding an unfinished prepare of the same inputs whose prepare.json was edited."""
    def setup(base: Path, prepared: Path) -> None:
        index = json.loads((prepared / "good" / "index.json").read_text())
        (base / "out").mkdir()
        shutil.copy2(prepared / "good" / "shard-00000.bin", base / "out" / "shard-00000.bin")
        record = {"inputs": index["inputs"], "shards": index["shards"][:1], "next_doc": 50, "skip": 3,
                  "task": {"index": 0, "first_doc": 0, "task_bytes": 1 << 18}}
        edit(record)
        (base / "out" / "prepare.json").write_text(json.dumps(record))
    return setup


def finished_without_counts(base: Path, prepared: Path) -> None:
    shutil.copytree(prepared / "good", base / "out")
    index = json.loads((base / "out" / "index.json").read_text())
    del index["num_tokens"]
    (base / "out" / "index.json").write_text(json.dumps(index))


def dangling_out(base: Path, prepared: Path) -> None:
    write(base / "a.jsonl", notes(20))
    (base / "out").symlink_to(base / "nowhere")


@dataclass(frozen=True)
class PrepCase:
    id: str
    setup: Setup  # may write sources and --out
    args: tuple[str, ...]  # "{base}" (the case's folder) and "{prepared}" are filled in
    fragment: str
    out_left: bool = False  # --out existed before the case (its files must not change)


def src(name: str, data: str | bytes) -> Setup:
    return lambda base, prepared: write(base / name, data)


EMPTY_TEXTS = "".join(json.dumps({"text": ""}) + "\n" for _ in range(20))
OUT = ("--out", "{base}/out")
AGAIN = ("{prepared}/notes.jsonl", *OUT, "--shard-tokens", "2000")  # the prepared folder's own inputs
PREP_CASES = [
    PrepCase("an empty .jsonl (wrote an index of 0 tokens, exit 0)", src("a.jsonl", ""), ("{base}/a.jsonl", *OUT),
             "the sources hold no documents"),
    PrepCase("every text empty (exit 0)", src("a.jsonl", EMPTY_TEXTS), ("{base}/a.jsonl", *OUT),
             "the sources hold no documents"),
    PrepCase("a .parquet file without rows (exit 0)", lambda base, _: parquet_without_rows(base / "a.parquet"),
             ("{base}/a.parquet", *OUT), "the sources hold no documents"),
    PrepCase("a .json list nested too deeply (traceback)", src("a.json", DEEP), ("{base}/a.json", *OUT),
             "could not be read as JSON (maximum recursion depth"),
    PrepCase("a .jsonl line nested too deeply (a worker died)", src("a.jsonl", '{"text": "x", "y": ' + DEEP + "}\n"),
             ("{base}/a.jsonl", *OUT), "could not be read as JSON (line 1: maximum recursion depth"),
    PrepCase("--out inside the source folder", src("src/a.jsonl", notes(20)),
             ("{base}/src", "--out", "{base}/src/shards"), "lies inside the source folder"),
    PrepCase("--shard-tokens 2^40 (MemoryError)", src("a.jsonl", notes(20)),
             ("{base}/a.jsonl", *OUT, "--shard-tokens", str(1 << 40)), "--shard-tokens 1099511627776: at most"),
    PrepCase("--workers 100000 (would start 100000 processes)", src("a.jsonl", notes(20)),
             ("{base}/a.jsonl", *OUT, "--workers", "100000"), "--workers 100000: at most"),
    PrepCase("--out a dangling link (the message named --job.run_dir)", dangling_out, ("{base}/a.jsonl", *OUT),
             "which does not exist; give a folder", out_left=True),
    PrepCase("prepare.json edited: next_doc not a count (traceback)", unfinished(lambda r: r.update(next_doc="x")),
             AGAIN, "prepare.json is damaged (next_doc 'x'", out_left=True),
    PrepCase("prepare.json edited: shards not a list (traceback)", unfinished(lambda r: r.update(shards="garbage")),
             AGAIN, "prepare.json is damaged (no list of shards)", out_left=True),
    PrepCase("prepare.json edited: a shard outside the folder",
             unfinished(lambda r: r["shards"][0].update(file="../evil.bin")),  # type: ignore[index]
             AGAIN, "shard entry 0 is not shard-00000.bin of 2000 tokens", out_left=True),
    PrepCase("finished index.json without num_tokens (traceback)", finished_without_counts, AGAIN,
             "its index.json names these inputs but its counts are damaged", out_left=True),
    PrepCase("guard: a .jsonl line that is an array", src("a.jsonl", "[1, 2]\n"), ("{base}/a.jsonl", *OUT),
             'row 0 is list, not an object with a "text" field'),
    PrepCase("guard: a Latin-1 .txt file", src("a.txt", b"caf\xe9"), ("{base}/a.txt", *OUT), "is not UTF-8 text"),
]


@pytest.mark.parametrize("case", PREP_CASES, ids=[c.id for c in PREP_CASES])
def test_hostile_prepare_input_is_one_clean_error_and_changes_nothing(
        case: PrepCase, prepared: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case.setup(tmp_path, prepared)
    before, kept = snapshot(tmp_path), snapshot(prepared)
    result = prepare(capsys, *(a.format(base=tmp_path, prepared=prepared) for a in case.args), "--tokenizer", "builtin")
    TABLE.append((f"titan-data: {case.id}", result.code, first_error_line(result)))
    assert_one_clean_error(result, case.fragment)
    assert_unchanged(before, tmp_path)
    assert_unchanged(kept, prepared)
    if not case.out_left:  # nothing half-made is left behind
        assert not (tmp_path / "out").exists() and not (tmp_path / "src" / "shards").exists()


# ---- data.mix values and JSON read by the trainer ----------------------------------------------------------


def test_a_mixture_weight_of_true_is_refused_not_read_as_1(
        prepared: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    isolate(monkeypatch)
    config = tmp_path / "mix.toml"
    config.write_text(f'[data.mix.notes]\nsource = "tokens:{prepared / "good"}"\nweight = true\n', encoding="utf-8")
    result = run_in_process(capsys, *TRAIN, "--config", str(config), f"--job.run_dir={tmp_path / 'run'}")
    TABLE.append(("data.mix weight = true (ran as weight 1)", result.code, first_error_line(result)))
    assert_one_clean_error(result, "data.mix.notes.weight = true is a boolean, but data.mix.notes.weight takes a number")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_data_file_nested_too_deeply_is_a_config_error_for_the_trainer(tmp_path: Path) -> None:
    """The trainer's own .jsonl and .json readers (not titan-data's) refuse it the same way."""
    from titan_core.data.sources import read_documents
    from titan_core.errors import ConfigError

    write(tmp_path / "a.jsonl", '{"text": "x", "y": ' + DEEP + "}\n")
    write(tmp_path / "b.json", DEEP)
    with pytest.raises(ConfigError, match=r"a.jsonl could not be read as JSON: line 1 is not valid JSON \(maximum"):
        read_documents(str(tmp_path / "a.jsonl"))
    with pytest.raises(ConfigError, match=r"b.json could not be read as JSON: it is nested too deeply"):
        read_documents(str(tmp_path / "b.json"))
