"""titan-data prepare and the tokens:DIR source: round trip, worker-count independence, kill and
resume of a real process, hostile shard sets, mixtures and the prefetching loader's state."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import numpy as np
import pytest
import torch

from titan_core.commands.data_prepare import main as data_main
from titan_core.data import build_dataloader, build_mixture_loader
from titan_core.data.loader import TokenDataLoader
from titan_core.data.packing import pack_documents, split_stream
from titan_core.data.prefetch import PrefetchingLoader
from titan_core.data.sources import read_documents
from titan_core.data.tokenizer import TiktokenTokenizer, read_bpe_ranks
from titan_core.errors import ConfigError
from titan_core.plan.tokenizer import build_tokenizer

from conftest import REPO, CliResult, assert_user_error

TOK = build_tokenizer("builtin")


def write_corpus(folder: Path, n: int = 400) -> Path:
    """A folder with a .jsonl, a .txt and a .parquet file (sorted order: a, b, c)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "a.jsonl").open("w") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"document {i}: " + " ".join(f"w{i}.{j}" for j in range(i % 37 + 3))}) + "\n")
        f.write(json.dumps({"text": ""}) + "\n")  # skipped, as the trainer skips it
    (folder / "b.txt").write_text("one plain text document\nof two lines, with <|end_of_text|> as text")
    pq.write_table(pa.table({"text": [f"parquet row {i} " * (i % 5 + 1) for i in range(50)]}), folder / "c.parquet")
    return folder


def prepare(capsys: pytest.CaptureFixture[str], *args: str) -> CliResult:
    code = data_main(["prepare", *args, "--quiet"])
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)


def output_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != ".verified.json"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "src")


@pytest.fixture(scope="module")
def shards(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards") / "out"
    assert data_main(["prepare", str(corpus), "--tokenizer", "builtin", "--out", str(out), "--shard-tokens", "4000",
                      "--quiet"]) == 0
    return out


def test_prepare_round_trip_decodes_to_the_sources_and_any_worker_count_writes_the_same_bytes(
        corpus: Path, shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index = json.loads((shards / "index.json").read_text())
    docs = read_documents(str(corpus))
    assert index["num_documents"] == len(docs) == 451 and index["dtype"] == "uint16"
    assert len(index["shards"]) == -(-index["num_tokens"] // 4000) > 3
    assert all(s["tokens"] == 4000 for s in index["shards"][:-1])
    stream = np.concatenate([np.fromfile(shards / s["file"], dtype="<u2") for s in index["shards"]])
    assert stream.tolist() == pack_documents(docs, TOK).tokens.tolist()
    offsets = np.fromfile(shards / "documents.bin", dtype="<i8")
    assert offsets.size == len(docs) + 1 and offsets[-1] == stream.size
    for i in (0, 17, 400, 450):  # each document decodes to its source text between BOS and EOS
        doc = stream[offsets[i] : offsets[i + 1]].tolist()
        assert doc[0] == TOK.bos_id and doc[-1] == TOK.eos_id and TOK.decode(doc[1:-1]) == docs[i]
    assert index["tokenizer"]["fingerprint"] == TOK.fingerprint
    files = index["inputs"]["sources"][0]["files"]
    assert [Path(f["path"]).name for f in files] == ["a.jsonl", "b.txt", "c.parquet"]
    assert files[1]["size"] == (corpus / "b.txt").stat().st_size and len(files[1]["sha256"]) == 64
    for workers in ("2", "3"):
        out = tmp_path / f"w{workers}"
        assert prepare(capsys, str(corpus), "--tokenizer", "builtin", "--out", str(out), "--shard-tokens", "4000",
                       "--workers", workers).code == 0
        assert output_bytes(out) == output_bytes(shards)


NO_TORCH_PREPARE = """
import sys
from titan_core.commands.data_prepare import main
codes = [main(["prepare", sys.argv[1], "--tokenizer", "builtin", "--out", out, "--workers", n, "--shard-tokens", "512",
               "--quiet"]) for out, n in ((sys.argv[2], "1"), (sys.argv[3], "2"))]
print(codes, "torch" in sys.modules, "titan_core.data.loader" in sys.modules)
"""


def test_prepare_runs_without_torch_and_one_or_two_workers_write_the_same_bytes(tmp_path: Path) -> None:
    """The command's whole path (parser, pipeline, forked workers writing their own pieces) never imports
    torch, so it starts in the time Python and the tokenizer take; the pieces of two workers land in the
    shards in source order: the bytes of one worker's run."""
    src = tmp_path / "small.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i} " + "word " * (i % 13)}) + "\n" for i in range(600)))
    one, two = tmp_path / "one", tmp_path / "two"
    result = subprocess.run([sys.executable, "-c", NO_TORCH_PREPARE, str(src), str(one), str(two)], capture_output=True,
                            text=True, timeout=120)
    assert result.stdout.splitlines()[-1] == "[0, 0] False False", result.stdout + result.stderr
    assert len(json.loads((one / "index.json").read_text())["shards"]) > 3
    assert output_bytes(one) == output_bytes(two)


def test_tokens_source_gives_the_text_sources_windows_in_both_splits_and_on_two_ranks(
        corpus: Path, shards: Path) -> None:
    """Validation is sequential: the text path's batches exactly. Train: the same windows every epoch, in a
    seeded order of its own (a Feistel permutation that holds no memory), the same on one process and two ranks."""
    for split in ("train", "validation"):
        kw = dict(tokenizer=TOK, seq_len=31, seed=5, split=split, val_fraction=0.1)
        text = build_dataloader(source=str(corpus), local_batch_size=4, **kw)  # type: ignore[arg-type]
        tokens = build_dataloader(source=f"tokens:{shards}", local_batch_size=4, **kw)  # type: ignore[arg-type]
        halves = [build_dataloader(source=f"tokens:{shards}", local_batch_size=2, dp_rank=r, dp_world_size=2, **kw)
                  for r in (0, 1)]  # type: ignore[arg-type]
        assert tokens.num_windows == text.num_windows
        epochs: list[list[list[int]]] = [[], []]
        for _ in range(2):
            for _ in range(tokens.batches_per_epoch):
                want, got = next(text), next(tokens)
                assert torch.equal(torch.cat([next(h)[0] for h in halves]), got[0])
                if split == "validation":
                    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
                epochs[0] += want[0].tolist()
                epochs[1] += got[0].tolist()
        every = {tuple(w) for w in text._windows[:, :-1].tolist()}  # all windows of the split, from the text path
        per_epoch = tokens.batches_per_epoch * 4
        for epoch in (epochs[1][:per_epoch], epochs[1][per_epoch:]):
            assert len({tuple(w) for w in epoch}) == per_epoch and {tuple(w) for w in epoch} <= every
        if split == "train":
            assert epochs[0] != epochs[1]  # its own order
            seeded = build_dataloader(source=f"tokens:{shards}", local_batch_size=4, **kw)  # type: ignore[arg-type]
            other = build_dataloader(source=f"tokens:{shards}", local_batch_size=4,
                                     **{**kw, "seed": 6})  # type: ignore[arg-type]
            first = next(seeded)[0]
            assert first.tolist() == epochs[1][:4] and not torch.equal(first, next(other)[0])


def test_lazy_order_is_a_permutation_for_every_size() -> None:
    from titan_core.data.permutation import LazyOrder

    for n in (1, 2, 3, 5, 64, 65, 1000, 4099):
        for epoch in (0, 1):
            order = LazyOrder(n, seed=7, epoch=epoch, shuffle=True)
            assert sorted(order[0:n].tolist()) == list(range(n))
    a, b = LazyOrder(1000, seed=7, epoch=0, shuffle=True), LazyOrder(1000, seed=7, epoch=1, shuffle=True)
    assert a[0:1000].tolist() != b[0:1000].tolist() and a[0:1000].tolist() != list(range(1000))


def test_kill_during_prepare_keeps_finished_shards_and_the_next_call_finishes_them(
        shards: Path, tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    with big.open("w") as f:
        for i in range(6000):
            f.write(json.dumps({"text": f"document {i} " + "some words to tokenize here " * 20}) + "\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "titan_core.commands.data_prepare", "prepare", str(big), "--tokenizer", "builtin",
           "--out", str(out), "--shard-tokens", "20000", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (out / "shard-00003.bin").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the tool and its worker, mid-run
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "prepare finished before it could be killed; give it more work"
    assert not (out / "index.json").exists() and (out / "prepare.json").exists()
    # the shards prepare.json records as finished (a shard renamed into place just before the kill, but
    # not yet recorded, is written again, with the same bytes)
    recorded = [s["file"] for s in json.loads((out / "prepare.json").read_text())["shards"]]
    kept = {name: (out / name).stat().st_mtime_ns for name in recorded}
    assert len(kept) >= 3
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    # finished shards were kept as they were, not written again
    assert all((out / name).stat().st_mtime_ns == mtime for name, mtime in kept.items())
    reference = tmp_path / "reference"
    assert data_main(["prepare", str(big), "--tokenizer", "builtin", "--out", str(reference), "--shard-tokens", "20000",
                      "--quiet"]) == 0
    assert output_bytes(out) == output_bytes(reference)
    assert not (out / "prepare.json").exists() and not list(out.glob("*.docs")) and not list(out.glob("*.tmp"))


def test_an_interrupt_after_any_shard_resumes_to_the_same_bytes_with_or_without_the_task_hint(
        corpus: Path, shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Stopped right after shard k is recorded (shards end mid-document and on a task's last document),
    the next call writes the rest: the bytes equal an uninterrupted run's. Small tasks, so the resume
    starts at a later task (its hint in prepare.json), and once without the hint (everything read again)."""
    from titan_core.data.prepare import tasks, writer

    monkeypatch.setattr(tasks, "TASK_BYTES", 3000)
    monkeypatch.setattr(writer, "TASK_BYTES", 3000)
    args = [str(corpus), "--tokenizer", "builtin", "--shard-tokens", "4000", "--workers", "2"]
    reference = output_bytes(shards)
    real_flush = writer.ShardWriter.flush
    hints = set()
    for stop_after in (1, 2, 4):
        for keep_hint in (True, False):
            out = tmp_path / f"stop{stop_after}{keep_hint}"

            def flush(self: writer.ShardWriter, *, final: bool = False) -> None:
                real_flush(self, final=final)
                if len(self.shards) == stop_after:  # noqa: B023 (the loop's value, read during this call)
                    raise KeyboardInterrupt

            monkeypatch.setattr(writer.ShardWriter, "flush", flush)
            assert prepare(capsys, *args, "--out", str(out)).code == 130
            saved = json.loads((out / "prepare.json").read_text())
            assert len(saved["shards"]) == stop_after and not (out / "index.json").exists()
            hints.add((saved["task"]["index"] > 0, saved["skip"] > 0))
            if not keep_hint:
                del saved["task"]
                (out / "prepare.json").write_text(json.dumps(saved))
            monkeypatch.setattr(writer.ShardWriter, "flush", real_flush)
            assert prepare(capsys, *args, "--out", str(out)).code == 0
            assert output_bytes(out) == reference, (stop_after, keep_hint)
    assert (True, True) in hints  # a later task and a document cut by the shard's end were resumed


def test_a_shard_write_failing_in_the_writer_thread_is_one_message_and_the_next_call_finishes(
        corpus: Path, shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Shards are written by a background thread: a full disk on the third shard still stops prepare
    with one message, the progress record names only the shards on disk, and the next call writes
    the same bytes as an uninterrupted run."""
    from titan_core.data.prepare import writer

    real_publish = writer.publish
    written: list[str] = []

    def publish_until_full(f: IO[bytes], tmp: Path, path: Path) -> None:
        if len(written) == 2:
            f.close()
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        written.append(path.name)
        real_publish(f, tmp, path)

    monkeypatch.setattr(writer, "publish", publish_until_full)
    monkeypatch.setattr(writer, "SYNC_BYTES", 1000)  # shards of 8000 bytes: flushed to disk while they fill
    out = tmp_path / "out"
    args = [str(corpus), "--tokenizer", "builtin", "--shard-tokens", "4000", "--workers", "2", "--out", str(out)]
    failed = prepare(capsys, *args)
    assert failed.code != 0 and failed.err.count("titan-data: error:") == 1, failed.err
    assert "space" in failed.err.lower() and "Traceback" not in failed.err
    saved = json.loads((out / "prepare.json").read_text())
    assert [s["file"] for s in saved["shards"]] == written and not (out / "index.json").exists()
    monkeypatch.setattr(writer, "publish", real_publish)
    assert prepare(capsys, *args).code == 0
    assert output_bytes(out) == output_bytes(shards)


@pytest.mark.parametrize("signum, code, said", [(signal.SIGTERM, 143, "stopped by SIGTERM"),
                                                (signal.SIGINT, 130, "interrupted")])
def test_sigterm_and_ctrl_c_stop_prepare_with_one_line_and_keep_what_is_finished(
        tmp_path: Path, signum: int, code: int, said: str) -> None:
    big = tmp_path / "big.txt"
    big.write_text("words and more words " * 400_000)  # one long document: one task, many shards
    cmd = [sys.executable, "-m", "titan_core.commands.data_prepare", "prepare", str(big), "--tokenizer", "builtin",
           "--out", str(tmp_path / "out"), "--workers", "2"]
    # SIGINT's default restored: a shell running the tests in the background ignores it, and children inherit that
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not (tmp_path / "out").exists() and time.monotonic() < deadline:  # inputs checked, tokenizing
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert said in err and "the same command continues" in err and "Traceback" not in err


@pytest.mark.parametrize("case", ["missing", "extension", "tokenizer", "out_is_file", "foreign_out", "workers", "hf"])
def test_prepare_refuses_bad_inputs_with_one_message_exit_2_and_writes_nothing(
        case: str, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, tok, out, extra = str(corpus), "builtin", tmp_path / "out", []
    expected = {"missing": "does not exist", "extension": 'unsupported extension ".csv"',
                "tokenizer": "tokenizer file", "out_is_file": "is a file", "foreign_out": "did not write",
                "workers": "at least 1 worker", "hf": "--allow-download"}[case]
    if case == "missing":
        src = str(tmp_path / "nope.jsonl")
    elif case == "extension":
        (tmp_path / "x.csv").write_text("a,b")
        src = str(tmp_path / "x.csv")
    elif case == "tokenizer":
        tok = str(tmp_path / "no.model")
    elif case == "out_is_file":
        out.write_text("mine")
    elif case == "foreign_out":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    elif case == "workers":
        extra = ["--workers", "0"]
    else:
        src = "hf:someone/dataset"
    before = sorted(p.name for p in tmp_path.iterdir())
    result = prepare(capsys, src, "--tokenizer", tok, "--out", str(out), *extra)
    assert_user_error(result, expected)
    assert result.err.count("error:") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if case == "foreign_out":
        assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_json_files_and_a_bad_row_far_into_a_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A .json list and JSON lines in a .json file give read_documents' documents; a bad row in a later task
    (read by a worker, not the parent) names its file and its line or row, exit 2, and no folder is left."""
    from titan_core.data.prepare import tasks

    monkeypatch.setattr(tasks, "TASK_BYTES", 2000)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.json").write_text(json.dumps([{"text": f"listed {i}"} for i in range(30)] + [{"text": None}]))
    (src / "b.json").write_text("".join(json.dumps({"text": f"line {i} " * 5}) + "\n" for i in range(300)))
    out = tmp_path / "out"
    assert prepare(capsys, str(src), "--tokenizer", "builtin", "--out", str(out), "--workers", "2").code == 0
    stream = np.concatenate([np.fromfile(out / s["file"], dtype="<u2")
                             for s in json.loads((out / "index.json").read_text())["shards"]])
    assert stream.tolist() == pack_documents(read_documents(str(src)), TOK).tokens.tolist()
    lines = [json.dumps({"text": f"row {i} " * 5}) for i in range(2000)]
    for bad, expected in (("{not json", "line 1501"), (json.dumps({"text": 7}), 'row 1500 field "text" holds int'),
                          (json.dumps({"body": "x"}), 'row 1500 has no field "text"')):
        (src / "b.json").write_text("\n".join(lines[:1500] + [bad] + lines[1501:]) + "\n")
        result = prepare(capsys, str(src / "b.json"), "--tokenizer", "builtin", "--out", str(tmp_path / "bad"),
                         "--workers", "2")
        assert_user_error(result, f"{src / 'b.json'}", expected)
        assert not (tmp_path / "bad").exists()


def test_hf_source_streams_a_local_dataset_folder_whole(
        corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``hf:NAME --allow-download`` streams ``datasets.load_dataset(NAME, streaming=True)``; a local dataset
    folder loads the same way with no network. Every row arrives (the trainer's in-memory cap on hub text is
    set far below this dataset and does not apply), as the same tokens as the file read directly."""
    from titan_core.data import sources

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(sources, "HF_MAX_BYTES", 1000)
    hub = tmp_path / "hub"
    (hub / "data").mkdir(parents=True)
    (hub / "data" / "train.jsonl").write_bytes((corpus / "a.jsonl").read_bytes())
    assert (corpus / "a.jsonl").stat().st_size > 20 * 1000
    direct, streamed = tmp_path / "direct", tmp_path / "streamed"
    assert prepare(capsys, str(corpus / "a.jsonl"), "--tokenizer", "builtin", "--out", str(direct)).code == 0
    result = prepare(capsys, f"hf:{hub}", "--allow-download", "--tokenizer", "builtin", "--out", str(streamed),
                     "--workers", "2")
    assert result.code == 0, result.err
    index = json.loads((streamed / "index.json").read_text())
    assert index["num_documents"] == 400 and index["inputs"]["sources"] == [{"source": f"hf:{hub}", "split": "train"}]
    for name in ("shard-00000.bin", "documents.bin"):
        assert (streamed / name).read_bytes() == (direct / name).read_bytes()
    assert not list(streamed.glob("*.tmp"))  # the texts handed to the workers through files are gone
    missing = prepare(capsys, f"hf:{hub}", "--allow-download", "--hf-split", "test", "--tokenizer", "builtin", "--out",
                      str(tmp_path / "none"))
    assert_user_error(missing, 'could not open hub dataset')
    assert not (tmp_path / "none").exists()


def test_prepare_into_a_finished_folder_of_other_inputs_is_refused_and_the_same_inputs_are_a_no_op(
        corpus: Path, shards: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = output_bytes(shards)
    same = prepare(capsys, str(corpus), "--tokenizer", "builtin", "--out", str(shards), "--shard-tokens", "4000")
    assert same.code == 0
    other = prepare(capsys, str(corpus), "--tokenizer", "builtin", "--out", str(shards), "--shard-tokens", "999")
    assert_user_error(other, "prepared from other inputs")
    assert output_bytes(shards) == before


# ---- hostile shard sets: each one clear error, nothing changed -----------------------------------


def other_tokenizer(tmp_path: Path) -> TiktokenTokenizer:
    from titan_core.data.tokenizer import BUILTIN_PATH, BUILTIN_SPECIAL_TOKENS

    ranks = read_bpe_ranks(BUILTIN_PATH)
    ranks = dict(sorted(ranks.items(), key=lambda kv: kv[1])[:1500])  # a smaller vocabulary: another tokenizer
    return TiktokenTokenizer(ranks, special_tokens=BUILTIN_SPECIAL_TOKENS, name="small")


@pytest.mark.parametrize("case", ["truncated", "edited", "outside_name", "outside_link", "tokenizer", "unfinished"])
def test_hostile_shard_sets_are_refused_naming_the_problem(case: str, shards: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(shards, folder)  # copy2 keeps the mtimes: the copy takes the fast path as the original does
    index = json.loads((folder / "index.json").read_text())
    tok = TOK
    shard = folder / "shard-00001.bin"
    if case == "truncated":
        shard.write_bytes(shard.read_bytes()[:-2])
        expected = "has 7998 bytes but the index records 8000"
    elif case == "edited":
        data = bytearray(shard.read_bytes())
        data[100] ^= 1
        shard.write_bytes(bytes(data))
        expected = "shard-00001.bin was modified after it was written"
    elif case == "outside_name":
        (tmp_path / "evil.bin").write_bytes(shard.read_bytes())
        index["shards"][1]["file"] = "../evil.bin"
        (folder / "index.json").write_text(json.dumps(index))
        expected = "names shard '../evil.bin', which is not a plain file name inside the folder"
    elif case == "outside_link":
        (tmp_path / "evil.bin").write_bytes(shard.read_bytes())
        shard.unlink()
        shard.symlink_to(tmp_path / "evil.bin")
        expected = "shard shard-00001.bin points outside the folder"
    elif case == "tokenizer":
        tok = other_tokenizer(tmp_path)
        expected = f"built with tokenizer 'builtin' (fingerprint {TOK.fingerprint}), but this run's tokenizer 'small'"
    else:
        (folder / "index.json").rename(folder / "prepare.json")
        expected = "titan-data prepare did not finish"
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match=r"shard set .*copy") as info:
        build_dataloader(source=f"tokens:{folder}", tokenizer=tok, seq_len=31, local_batch_size=2)
    assert expected in str(info.value)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before


def test_a_run_on_shards_of_another_tokenizer_stops_at_start_up_with_exit_2(shards: Path, tmp_path: Path) -> None:
    from titan_core.data.tokenizer import write_bpe_ranks

    write_bpe_ranks(tmp_path / "small.model", other_tokenizer(tmp_path).mergeable_ranks)
    from conftest import run_cli

    result = run_cli("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.steps=1",
                     f"--data.source=tokens:{shards}", f"--data.tokenizer={tmp_path / 'small.model'}",
                     f"--job.run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert_user_error(result, "was built with tokenizer 'builtin'", "set data.tokenizer to the tokenizer the shards")
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and not (tmp_path / "run" / "checkpoints").exists()


# ---- mixtures ---------------------------------------------------------------------------------------


def mixture(shards: Path, corpus: Path, **kw: object):
    args: dict[str, object] = dict(tokenizer=TOK, seq_len=31, local_batch_size=8, seed=3, val_fraction=0.1)
    args.update(kw)
    mix = {"web": (f"tokens:{shards}", 0.7), "code": (str(corpus / "a.jsonl"), 0.2), "book": ("builtin", 0.1)}
    return build_mixture_loader(mix=mix, **args)  # type: ignore[arg-type]


def test_mixture_shares_of_tokens_are_within_one_percent_of_the_weights_over_1000_batches(
        shards: Path, corpus: Path) -> None:
    from titan_core.data.mixture import source_tokens

    loader = mixture(shards, corpus)
    for _ in range(1000):
        next(loader)
    seen = source_tokens(loader.state_dict(), 31)
    total = sum(seen.values())
    assert total == 1000 * 8 * 31
    for name, weight in (("web", 0.7), ("code", 0.2), ("book", 0.1)):
        assert abs(seen[f"tokens_seen.{name}"] / total - weight) <= 0.01, seen
    # deterministic for a seed, different for another
    again, other = mixture(shards, corpus), mixture(shards, corpus, seed=4)
    first = [next(again)[0] for _ in range(3)]
    assert all(torch.equal(a, next(b)[0]) for a, b in zip(first, [mixture(shards, corpus)] * 3))
    assert not torch.equal(first[0], next(other)[0])


def test_mixture_rows_come_from_their_sources_and_two_ranks_see_one_process_rows(shards: Path, corpus: Path) -> None:
    one = mixture(shards, corpus)
    ranks = [mixture(shards, corpus, local_batch_size=4, dp_rank=r, dp_world_size=2) for r in (0, 1)]
    for _ in range(20):
        inputs, _ = next(one)
        assert torch.equal(torch.cat([next(r)[0] for r in ranks]), inputs)
    assert one.state_dict() == ranks[0].state_dict() == ranks[1].state_dict()


@pytest.mark.parametrize("kind", ["tokens", "mixture"])
def test_prefetching_loader_saves_the_consumed_state_and_resumes_exactly_on_another_layout(
        kind: str, shards: Path, corpus: Path) -> None:
    def make(rank: int = 0, world: int = 1):
        if kind == "mixture":
            return mixture(shards, corpus, local_batch_size=8 // world, dp_rank=rank, dp_world_size=world)
        return build_dataloader(source=f"tokens:{shards}", tokenizer=TOK, seq_len=31, local_batch_size=8 // world,
                                dp_rank=rank, dp_world_size=world, seed=3)

    reference = make()
    want = [next(reference)[0] for _ in range(12)]
    ranks = [PrefetchingLoader(make(r, 2)) for r in (0, 1)]
    for step in range(7):
        assert torch.equal(torch.cat([next(r)[0] for r in ranks]), want[step])
    time.sleep(0.2)  # the thread has made batches ahead; they must not count
    state = ranks[0].state_dict()
    assert state == ranks[1].state_dict() == make_state_after(make, 7)
    resumed = PrefetchingLoader(make())
    resumed.load_state_dict(state)
    assert all(torch.equal(next(resumed)[0], want[step]) for step in range(7, 12))
    for r in (*ranks, resumed):
        r.close()
    assert resumed.wait_ms() >= 0


def make_state_after(make, n: int) -> dict[str, int]:  # type: ignore[no-untyped-def]
    loader = make()
    for _ in range(n):
        next(loader)
    return dict(loader.state_dict())


def test_mixture_flags_nest_into_the_data_section() -> None:
    from titan_core.plan.resolve import resolve_config

    resolved = resolve_config(config_source=None, override_pairs=[
        ("model.spec", "llama3"), ("data.mix.web.source", "tokens:/data/web"), ("data.mix.web.weight", "0.7"),
        ("data.mix.code.source", "builtin"), ("data.mix.code.weight", "3")])
    mix = resolved.config.data.mix
    assert {n: (m.source, m.weight) for n, m in mix.items()} == {"web": ("tokens:/data/web", 0.7),
                                                                  "code": ("builtin", 3.0)}
    with pytest.raises(ConfigError, match=r"data.mix.web.weight"):
        resolve_config(config_source=None, override_pairs=[("model.spec", "llama3"), ("data.mix.web.source", "x"),
                                                           ("data.mix.web.weight", "-1")])


def test_text_loader_is_unchanged_by_the_window_reader(corpus: Path) -> None:
    packed = pack_documents(read_documents(str(corpus)), TOK)
    stream, _ = split_stream(packed, split="train", val_fraction=0.0)
    loader = TokenDataLoader(stream, seq_len=15, local_batch_size=2, seed=1)
    inputs, labels = next(loader)
    rows = torch.randperm(loader.num_windows, generator=torch.Generator().manual_seed(1 * 0x9E3779B97F4A7C15
                                                                                    & ((1 << 63) - 1)))[:2]
    windows = stream[: loader.num_windows * 16].view(-1, 16)[rows].long()
    assert torch.equal(inputs, windows[:, :-1]) and torch.equal(labels, windows[:, 1:])


def test_task_files_hold_json_texts_and_a_pickle_or_garbage_in_their_place_is_refused_unexecuted(
        tmp_path: Path) -> None:
    """The texts a worker reads from its spill file are a JSON list: any str round-trips (non-ASCII,
    a lone surrogate from undecodable bytes), and a file swapped for a pickle runs nothing."""
    import pickle

    from titan_core.data.prepare.tasks import read_spilled_texts, spilled_texts
    from titan_core.errors import TitanError

    texts = ("plain", "ünïcödé ✓", "bad byte \udcff kept", "")
    good = tmp_path / "good.tmp"
    good.write_bytes(spilled_texts(texts))
    assert read_spilled_texts(good) == texts

    marker = tmp_path / "executed"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.mkdir, (str(marker),))

    cases = {"pickle.tmp": pickle.dumps(Payload()), "garbage.tmp": b"\x00\xff not json",
             "object.tmp": b'{"a": 1}', "numbers.tmp": b"[1, 2]"}
    for name, payload in cases.items():
        path = tmp_path / name
        path.write_bytes(payload)
        with pytest.raises(TitanError, match=f"the task file {path}"):
            read_spilled_texts(path)
        assert path.read_bytes() == payload  # left as it was
    assert not marker.exists()  # the pickle's code never ran


def _worker_deaf_to_sigterm(conn: object, *args: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a worker that swallowed the stop before its own handler
    while True:
        time.sleep(1)


def test_a_worker_that_does_not_end_when_stopped_is_killed_not_waited_on_for_ever(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A forked worker inherits the caller's SIGTERM handler until it sets its own, so an early stop can be
    # swallowed (a CI run hung on it in prepare's close()).
    from titan_core.data.prepare import workers as prepare_workers

    monkeypatch.setattr(prepare_workers, "_worker_main", _worker_deaf_to_sigterm)  # workers are forked here
    workers = prepare_workers.Workers(1, out=tmp_path, dtype="uint32", text_field="text", tok=build_tokenizer("builtin"),
                                      load_tokenizer=build_tokenizer, tokenizer="builtin")
    proc = workers.procs[0]
    time.sleep(0.5)  # let it ignore SIGTERM
    start = time.monotonic()
    workers.close(stop=True)
    assert not proc.is_alive() and proc.exitcode == -signal.SIGKILL
    # A stop kills at once (SIGKILL, which no handler catches): no wait for a worker deaf to SIGTERM.
    assert time.monotonic() - start < prepare_workers.WORKER_EXIT_S
