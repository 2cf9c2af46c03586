"""titan-data prepare tells the truth about what it packed, and reads files by the trainer's own rules
(data/text_rules.py, data/prepare/provenance.py): a byte-order mark, invalid UTF-8 and a row without the text
field mean the same to both; a link or a byte-identical copy of a file already read is skipped and named; an input
edited while prepare runs is refused with no index written (also an edit that keeps its size and restores its
mtime: each file is hashed before it is read and again after); a file added meanwhile is not packed and is named;
documents that repeat an earlier one are counted and named (data/prepare/repeats.py), and packed all the same.
In process, tiny inputs, the builtin tokenizer."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from titan_core.commands.data_prepare import main as data_main
from titan_core.data.packing import pack_documents
from titan_core.data.prepare import pipeline
from titan_core.data.sources import read_documents
from titan_core.errors import ConfigError
from titan_core.plan.tokenizer import build_tokenizer

from conftest import CliResult, assert_user_error

TOK = build_tokenizer("builtin")
BOM = b"\xef\xbb\xbf"


def prepare(capsys: pytest.CaptureFixture[str], *args: str) -> CliResult:
    code = data_main(["prepare", *args, "--tokenizer", "builtin", "--quiet"])
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)


def packed(out: Path) -> list[int]:
    index = json.loads((out / "index.json").read_text())
    return np.concatenate([np.fromfile(out / s["file"], dtype="<u2") for s in index["shards"]]).tolist()


def trainer_message(source: Path) -> str:
    with pytest.raises(ConfigError) as info:
        read_documents(str(source))
    return str(info.value)


def test_a_byte_order_mark_is_dropped_by_prepare_and_the_trainer_alike(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_bytes(BOM + "caf\u00e9 au lait".encode())
    (src / "b.jsonl").write_bytes(BOM + b'{"text": "first"}\n' + BOM + b'{"text": "after a cat of two files"}\n')
    (src / "c.json").write_bytes(BOM + json.dumps([{"text": "listed"}]).encode())
    docs = read_documents(str(src))
    assert docs == ["caf\u00e9 au lait", "first", "after a cat of two files", "listed"]  # no U+FEFF packed as text
    result = prepare(capsys, str(src), "--out", str(tmp_path / "out"))
    assert result.code == 0, result.text
    assert packed(tmp_path / "out") == pack_documents(docs, TOK).tokens.tolist()


@pytest.mark.parametrize("name, content, message", [
    ("latin1.jsonl", b'{"text": "ok"}\n{"text": "ok"}\n{"text": "caf\xe9"}\n',
     "latin1.jsonl line 3: invalid UTF-8 (undecodable byte 0xe9 at column 14); JSON text must be UTF-8"),
    ("latin1.json", b'[{"text": "caf\xe9"}]', "latin1.json is not UTF-8 text (undecodable byte at offset 14)"),
    ("latin1.txt", b"caf\xe9", "latin1.txt is not UTF-8 text (undecodable byte at offset 3)"),
    ("mixed.jsonl", b'{"text": "a"}\n{"body": "b"}\n{"text": null}\n',
     'mixed.jsonl line 2: row 1 has no field "text" (its fields: body); set '),
    ("mixed.json", json.dumps([{"text": "a"}, {"body": "b"}]).encode(),
     'mixed.json: row 1 has no field "text" (its fields: body); set '),
])
def test_invalid_utf8_and_a_row_without_the_text_field_are_one_refusal_in_both(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: bytes, message: str) -> None:
    source = tmp_path / name
    source.write_bytes(content)
    assert message in trainer_message(source)
    previous = tmp_path / "kept"  # a finished shard set beside it is not touched
    previous.mkdir()
    (previous / "index.json").write_text("{}")
    result = prepare(capsys, str(source), "--out", str(tmp_path / "out"))
    assert_user_error(result, message)
    assert not (tmp_path / "out").exists() and (previous / "index.json").read_text() == "{}"
    assert source.read_bytes() == content


@pytest.mark.parametrize("content", [
    b'{\n  "text": "one object over several lines"\n}\n',
    b'{"text": ["columns", "of lists"]}',
    b'["a list", "of strings"]',
])
def test_a_json_file_in_a_form_prepare_refuses_is_refused_by_the_trainer_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes) -> None:
    # A .json file holds a list of objects or one object per line; datasets used to read other forms for
    # the trainer (a file that could be trained on but not prepared, or read as something else).
    source = tmp_path / "other.json"
    source.write_bytes(content)
    message = trainer_message(source)
    assert "other.json" in message and "line 1" in message, message
    result = prepare(capsys, str(source), "--out", str(tmp_path / "out"))
    assert result.code == 2 and "other.json" in result.err and "Traceback" not in result.err, result.text
    assert not (tmp_path / "out").exists()


def test_a_json_list_over_several_lines_and_json_lines_in_a_json_file_are_read_alike(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, content in (("listed.json", b'[\n  {"text": "a"},\n  {"text": "b"}\n]\n'),
                          ("lines.json", b'{"text": "a"}\n{"text": "b"}\n')):
        source = tmp_path / name
        source.write_bytes(content)
        assert read_documents(str(source)) == ["a", "b"], name
        out = tmp_path / f"out-{source.stem}"
        assert prepare(capsys, str(source), "--out", str(out)).code == 0, name
        assert packed(out) == pack_documents(["a", "b"], TOK).tokens.tolist(), name


def test_a_null_text_is_an_empty_document_skipped_by_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "nulls.jsonl"
    source.write_text('{"text": "a"}\n{"text": null}\n{"text": ""}\n{"text": "b"}\n')
    assert read_documents(str(source)) == ["a", "b"]
    assert prepare(capsys, str(source), "--out", str(tmp_path / "out")).code == 0
    assert packed(tmp_path / "out") == pack_documents(["a", "b"], TOK).tokens.tolist()


def _duplicated_folder(root: Path) -> Path:
    src = root / "src"
    src.mkdir()
    (src / "a.txt").write_text("the one document that is here three times")
    shutil.copy(src / "a.txt", src / "b_copy.txt")
    (src / "c_link.txt").symlink_to(src / "a.txt")
    (src / "d.txt").write_text("another document of the same length as a!")
    assert (src / "d.txt").stat().st_size == (src / "a.txt").stat().st_size  # hashed, not told apart by size
    return src


def test_a_link_or_a_byte_identical_copy_is_skipped_and_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _duplicated_folder(tmp_path)
    result = prepare(capsys, str(src), "--out", str(tmp_path / "out"))
    assert result.code == 0, result.text
    assert (f"prepare: skipped {src / 'b_copy.txt'}: byte-identical to {src / 'a.txt'}, already read "
            "(--keep-duplicates packs it again)") in result.err
    assert f"prepare: skipped {src / 'c_link.txt'}: a link to {src / 'a.txt'}, already read" in result.err
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["num_documents"] == 2
    files = {Path(f["path"]).name: f for f in index["inputs"]["sources"][0]["files"]}
    assert files["b_copy.txt"]["duplicate_of"] == str((src / "a.txt").resolve())
    assert "duplicate_of" not in files["d.txt"]
    assert packed(tmp_path / "out") == pack_documents(
        [(src / "a.txt").read_text(), (src / "d.txt").read_text()], TOK).tokens.tolist()
    kept = prepare(capsys, str(src), "--out", str(tmp_path / "all"), "--keep-duplicates")
    assert kept.code == 0 and "skipped" not in kept.err
    assert json.loads((tmp_path / "all" / "index.json").read_text())["num_documents"] == 4


def _edit_during_packing(monkeypatch: pytest.MonkeyPatch, edit: object) -> None:
    """Run ``edit`` once the first task has been tokenized (one worker: in this process)."""
    real = pipeline.encode_documents
    calls = []

    def encode(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            edit()  # type: ignore[operator]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pipeline, "encode_documents", encode)


def test_an_input_edited_while_prepare_reads_it_is_refused_and_no_index_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    rows = "".join(json.dumps({"text": f"row {i} " + "word " * 40}) + "\n" for i in range(60))
    (src / "a.jsonl").write_text(rows)
    (src / "b.jsonl").write_text(rows)
    _edit_during_packing(monkeypatch, lambda: (src / "b.jsonl").open("a").write('{"text": "added late"}\n'))
    out = tmp_path / "out"
    result = prepare(capsys, str(src), "--out", str(out), "--shard-tokens", "512")
    assert_user_error(result, f"{src / 'b.jsonl'} changed (size {len(rows)} -> {len(rows) + 23} bytes) while prepare "
                      f"read it", f"no index.json was written in {out}")
    assert not (out / "index.json").exists()
    # the full shards written before the check are kept (nothing written is lost); prepare.json lists them
    saved = json.loads((out / "prepare.json").read_text())
    assert saved["shards"] and all((out / s["file"]).stat().st_size == 512 * 2 for s in saved["shards"])


def test_a_file_added_to_a_source_folder_meanwhile_is_not_packed_and_is_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("listed first")
    _edit_during_packing(monkeypatch, lambda: (src / "b.txt").write_text("arrived during prepare"))
    result = prepare(capsys, str(src), "--out", str(tmp_path / "out"))
    assert result.code == 0, result.text
    assert (f"prepare: {src / 'b.txt'} appeared after prepare listed its folder; it is not in this shard set "
            "(prepare again into a new --out to include it)") in result.err
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["num_documents"] == 1
    assert [Path(f["path"]).name for f in index["inputs"]["sources"][0]["files"]] == ["a.txt"]


def test_an_edit_that_keeps_the_size_and_restores_the_mtime_is_refused_and_no_index_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``cp -p``, ``rsync -t`` or ``touch -r`` leave a file: other bytes, the same size and modification time.
    Its first task is read before the edit, its last one after: the hash taken before the reads is not that of
    the text packed, and only hashing it again shows it (the size and mtime check passed this)."""
    src = tmp_path / "src"
    src.mkdir()
    path = src / "a.jsonl"
    path.write_text("".join(json.dumps({"text": f"row {i:04d} " + "word " * 50}) + "\n" for i in range(1200)))
    assert path.stat().st_size > 1 << 18  # two tasks at least (tasks.TASK_BYTES)
    listed = path.stat()

    def edit() -> None:
        data = path.read_bytes()
        at = data.rindex(b"row 1199")
        path.write_bytes(data[:at] + b"ROW 1199" + data[at + 8:])
        os.utime(path, ns=(listed.st_atime_ns, listed.st_mtime_ns))
        assert (path.stat().st_size, path.stat().st_mtime_ns) == (listed.st_size, listed.st_mtime_ns)

    _edit_during_packing(monkeypatch, edit)
    out = tmp_path / "out"
    result = prepare(capsys, str(src), "--out", str(out), "--shard-tokens", str(1 << 14))
    assert_user_error(result, f"{path} changed (its bytes differ from those hashed before it was read, though its "
                      "size and modification time are as they were) while prepare read it",
                      f"no index.json was written in {out}")
    assert not (out / "index.json").exists()
    saved = json.loads((out / "prepare.json").read_text())  # the full shards written are kept
    assert saved["shards"] and all((out / s["file"]).stat().st_size == (1 << 14) * 2 for s in saved["shards"])


@pytest.mark.parametrize("workers", ["1", "2"])
def test_each_file_is_hashed_before_its_first_read_and_again_after_its_last_and_the_index_has_its_sha256(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, workers: str) -> None:
    """Every read of a file lies between its two hashes: the planner's (it finds the tasks' byte ranges), and
    with one worker the tokenizing's too (forked workers' reads are not seen from here)."""
    from titan_core.data.prepare import provenance, tasks

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": f"line {i} " + "word " * 30}) + "\n" for i in range(2000)))
    (src / "b.txt").write_text("a text file")
    (src / "c.json").write_text(json.dumps([{"text": "listed"}, {"text": "rows"}]))
    other = tmp_path / "d.jsonl"
    other.write_text('{"text": "another source"}\n')
    events: list[tuple[str, str]] = []  # appended by the hashing threads and the planner (list.append is atomic)
    real_hash, real_plan = provenance.file_sha256, tasks._file_tasks

    def hashed(path: Path, stop: object = None) -> str:
        events.append(("hash", str(path)))
        return real_hash(path, stop)  # type: ignore[arg-type]

    def planned(path: Path, text_field: str):  # type: ignore[no-untyped-def]
        events.append(("read", str(path)))  # the planner's first read of the file (workers read after it)
        return real_plan(path, text_field)

    def read(task: tasks.Task, text_field: str) -> tasks.TaskDocuments:
        events.append(("read", task.path))
        return real_read(task, text_field)

    real_read = pipeline.read_task
    monkeypatch.setattr(provenance, "file_sha256", hashed)
    monkeypatch.setattr(tasks, "_file_tasks", planned)
    monkeypatch.setattr(pipeline, "read_task", read)
    out = tmp_path / "out"
    result = prepare(capsys, str(src), str(other), "--out", str(out), "--workers", workers)
    assert result.code == 0, result.text
    index = json.loads((out / "index.json").read_text())
    recorded = {Path(f["path"]): f["sha256"] for s in index["inputs"]["sources"] for f in s["files"]}
    files = [src / "a.jsonl", src / "b.txt", src / "c.json", other]
    assert recorded == {p.resolve(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    for path in map(str, files):
        seen = [what for what, p in events if p == path]
        assert seen[0] == seen[-1] == "hash" and set(seen[1:-1]) == {"read"}, (path, seen)
    if workers == "1":  # a.jsonl is two tasks, each read by the tokenizing after the planner's read
        assert [what for what, p in events if p == str(src / "a.jsonl")] == ["hash", "read", "read", "read", "hash"]


def _rows(*texts: str | None) -> str:
    return "".join(json.dumps({"text": t}) + "\n" for t in texts)


def _repeating_folder(root: Path) -> Path:
    """a.jsonl repeats its own rows, b.jsonl one of a's: lines 3, 6 and 7 of a and line 2 of b are repeats."""
    src = root / "src"
    src.mkdir()
    (src / "a.jsonl").write_text(_rows("alpha text", "beta text", "alpha text", None, "gamma text", "beta text",
                                       "alpha text"))
    (src / "b.jsonl").write_text(_rows("delta text", "gamma text"))
    return src


@pytest.mark.parametrize("workers", ["1", "2"])
def test_documents_that_repeat_an_earlier_one_are_counted_and_named_and_packed_as_the_sources_hold_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, workers: str) -> None:
    from titan_core.data.prepare import tasks, writer

    # Tasks of a line or two, so two workers share each file and the repeats lie in other tasks than the first.
    monkeypatch.setattr(tasks, "TASK_BYTES", 30)
    monkeypatch.setattr(writer, "TASK_BYTES", 30)
    src = _repeating_folder(tmp_path)
    a = src / "a.jsonl"
    out = tmp_path / "out"
    result = prepare(capsys, str(src), "--out", str(out), "--workers", workers, "--shard-tokens", "512")
    assert result.code == 0, result.text
    repeated = ["alpha text", "beta text", "alpha text", "gamma text"]
    tokens = sum(len(TOK.encode(t)) + 2 for t in repeated)  # as packed: [BOS] text [EOS]
    assert (f"prepare: 4 documents repeat an earlier document word for word ({tokens} tokens), packed again as the "
            f"sources hold them: {a} line 3 repeats {a} line 1; {a} line 6 repeats {a} line 2; {a} line 7 repeats "
            f"{a} line 1; and 1 more (index.json: repeated_documents)") in result.err.splitlines()
    index = json.loads((out / "index.json").read_text())
    assert index["repeated_documents"] == 4 and index["num_documents"] == 8
    assert packed(out) == pack_documents(read_documents(str(src)), TOK).tokens.tolist()  # nothing dropped
    assert not list(out.glob("*.digests")) and not list(out.glob("*.docs"))


def test_a_repeat_is_named_by_line_row_or_document_in_each_kind_of_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text(_rows("one", "two"))
    (src / "b.txt").write_text("one")
    (src / "c.json").write_text(json.dumps([{"text": None}, {"text": "x"}, {"text": "two"}]))
    pq.write_table(pa.table({"text": ["y", "one"]}), src / "d.parquet")
    result = prepare(capsys, str(src), "--out", str(tmp_path / "out"))
    assert result.code == 0, result.text
    a = src / "a.jsonl"
    # A .json list's documents are counted without its empty rows; parquet rows from 0, as prepare's other messages.
    assert (f"{src / 'b.txt'} repeats {a} line 1; {src / 'c.json'} document 2 repeats {a} line 2; "
            f"{src / 'd.parquet'} row 1 repeats {a} line 1 (index.json") in result.err


def test_no_repeats_is_no_line_and_a_count_of_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "a.jsonl"
    source.write_text(_rows("one", "two", "One", "one "))  # other case, other spacing: other texts
    result = prepare(capsys, str(source), "--out", str(tmp_path / "out"))
    assert result.code == 0 and "repeat" not in result.err, result.text
    assert json.loads((tmp_path / "out" / "index.json").read_text())["repeated_documents"] == 0


def test_a_resumed_prepare_counts_the_repeats_in_the_shards_it_kept(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped after a shard is recorded, the next call counts the kept shards' documents from their records;
    a kept shard without them (written by an older titan-core) is said, and no count is recorded."""
    from titan_core.data.prepare import writer

    source = tmp_path / "a.jsonl"
    source.write_text(_rows(*(f"document {i % 7} " + "word " * 40 for i in range(40))))  # 33 repeats
    whole = prepare(capsys, str(source), "--out", str(tmp_path / "whole"), "--shard-tokens", "512")
    assert whole.code == 0 and "prepare: 33 documents repeat" in whole.err, whole.text
    real_flush = writer.ShardWriter.flush

    def flush(self: writer.ShardWriter, *, final: bool = False) -> None:
        real_flush(self, final=final)
        if len(self.shards) == 2:
            raise KeyboardInterrupt

    for keep_records in (True, False):
        out = tmp_path / f"out-{keep_records}"
        monkeypatch.setattr(writer.ShardWriter, "flush", flush)
        assert prepare(capsys, str(source), "--out", str(out), "--shard-tokens", "512").code == 130
        assert sorted(p.name for p in out.glob("*.digests")) == ["shard-00000.bin.digests", "shard-00001.bin.digests"]
        if not keep_records:
            (out / "shard-00001.bin.digests").unlink()
        monkeypatch.setattr(writer.ShardWriter, "flush", real_flush)
        resumed = prepare(capsys, str(source), "--out", str(out), "--shard-tokens", "512")
        assert resumed.code == 0, resumed.text
        index = json.loads((out / "index.json").read_text())
        assert packed(out) == packed(tmp_path / "whole")
        if keep_records:
            assert resumed.err == whole.err and index["repeated_documents"] == 33
        else:
            assert "prepare: documents that repeat an earlier one were not counted" in resumed.err
            assert "repeated_documents" not in index


def test_a_damaged_record_names_no_file_and_raises_nothing() -> None:
    """A .digests file is the prepare's own, but it sits in the user's folder: a record pointing nowhere is said."""
    from titan_core.data.prepare.repeats import Repeats, repeats_line

    line = repeats_line(Repeats(2, 10, [((7, 0), (0, 0)), ((0, -5), (0, 3))]), [Path("a.txt")])
    assert line == ("prepare: 2 documents repeat an earlier document word for word (10 tokens), packed again as the "
                    "sources hold them: a document whose record is damaged (input 7, place 0) repeats a.txt; a "
                    "document whose record is damaged (input 0, place -5) repeats a.txt (index.json: "
                    "repeated_documents)")


def test_copies_among_many_files_of_one_size_name_the_first_of_their_content(tmp_path: Path) -> None:
    """Files of one size are told apart by content: each copy names the first file with its bytes."""
    from titan_core.data.prepare.provenance import find_duplicates

    texts = ["aaaa", "bbbb", "aaaa", "cccc", "bbbb", "aaaa", "dd"]
    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"f{i}.txt")
        paths[-1].write_text(text)
    hashes: dict[Path, str] = {}
    found = find_duplicates([paths[:4], None, paths[4:]], hashes)
    assert [(d.path.name, d.of.name, d.how) for d in found] == [
        ("f2.txt", "f0.txt", "byte-identical to"), ("f4.txt", "f1.txt", "byte-identical to"),
        ("f5.txt", "f0.txt", "byte-identical to")]
    assert paths[6] not in hashes  # the only file of its size is never read for this
