"""titan-data prepare tells the truth about what it packed, and reads files by the trainer's own rules
(data/text_rules.py, data/prepare/provenance.py): a byte-order mark, invalid UTF-8 and a row without the text
field mean the same to both; a link or a byte-identical copy of a file already read is skipped and named; an input
edited while prepare runs is refused with no index written; a file added meanwhile is not packed and is named.
In process, tiny inputs, the builtin tokenizer."""

from __future__ import annotations

import json
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
