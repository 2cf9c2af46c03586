"""Data loading: sources, packing, splits, DP sharding with exact parity, resumable state."""

from __future__ import annotations

import hashlib
import json
import platform
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
import torch

import titan_core.data.sources as sources
from titan_core.data import build_dataloader
from titan_core.data.corpus import MAX_BYTES, SNAPSHOT_PATH, builtin_documents
from titan_core.data.packing import clear_cache, is_validation_doc, tokenized_source
from titan_core.errors import ConfigError
from titan_core.plan.tokenizer import build_tokenizer

from conftest import REPO

TOK = build_tokenizer("builtin")


def docs(n: int, words: int = 40) -> list[str]:
    """Distinct documents: each names its index, so splits can be told apart after decoding."""
    return [f"document {i}: " + " ".join(f"w{i}.{j}" for j in range(words)) for i in range(n)]


def expected_stream(texts: list[str]) -> list[int]:
    out: list[int] = []
    for t in texts:
        out += TOK.encode(t, bos=True, eos=True)
    return out


def stream_of(source: str | Path, **kw: object) -> list[int]:
    return tokenized_source(str(source), TOK, text_field=str(kw.get("text_field", "text")), hf_split="train",
                            allow_download=bool(kw.get("allow_download", False))).tokens.tolist()


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def loader(source: str | Path, **kw: object):
    args: dict[str, object] = dict(tokenizer=TOK, seq_len=16, local_batch_size=2, val_fraction=0.0)
    args.update(kw)
    return build_dataloader(source=str(source), **args)  # type: ignore[arg-type]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A .jsonl of 30 documents: about 4000 tokens, ~240 windows of 16+1."""
    path = tmp_path / "corpus.jsonl"
    write_jsonl(path, [{"text": t} for t in docs(30)])
    return path


# ---- sources -----------------------------------------------------------------------------

def test_txt_is_one_document(tmp_path: Path) -> None:
    text = "first paragraph\n\nsecond paragraph — ünïcode\n"
    (tmp_path / "a.txt").write_text(text)
    assert stream_of(tmp_path / "a.txt") == expected_stream([text])


def test_jsonl_custom_field_skips_empty_rows(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    write_jsonl(path, [{"body": "alpha", "id": 1}, {"body": None, "id": 2}, {"body": "", "id": 3}, {"body": "beta", "id": 4}])
    assert stream_of(path, text_field="body") == expected_stream(["alpha", "beta"])


def test_json_array(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"text": "one"}, {"text": "two"}]))
    assert stream_of(path) == expected_stream(["one", "two"])


def test_json_lines_in_a_json_file_are_read_without_datasets(tmp_path: Path) -> None:
    """datasets (pyarrow, pandas) stays out of a run that reads JSON lines named .json: about 130 MiB
    resident for the whole run. A row whose text is a list is refused, naming it."""
    lines = tmp_path / "d.json"
    write_jsonl(lines, [{"text": "one"}, {"text": None}, {"text": "two"}])
    whole = tmp_path / "o.json"
    whole.write_text('{"text": ["three", "four"]}\n')
    code = ("import sys; from titan_core.data.sources import read_documents as r; "
            f"print(r({str(lines)!r}), 'datasets' in sys.modules, 'pyarrow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split("\n")[0] == "['one', 'two'] False False", out.stdout + out.stderr
    with pytest.raises(ConfigError, match="holds list, not text"):
        stream_of(whole)


def test_packing_hands_the_tokenizer_about_a_mebibyte_of_text_at_a_time() -> None:
    from titan_core.data.packing import pack_documents

    calls: list[int] = []

    class Counting:
        vocab_size, bos_id, eos_id = TOK.vocab_size, TOK.bos_id, TOK.eos_id

        def encode(self, text: str) -> list[int]:
            return TOK.encode(text)

        def encode_batch(self, texts: list[str], *, num_threads: int = 4) -> list[list[int]]:
            calls.append(sum(map(len, texts)))
            return [TOK.encode(t) for t in texts]

    texts = ["x" * 300_000] * 7 + ["y" * 3_000_000]
    packed = pack_documents(texts, Counting())  # type: ignore[arg-type]
    assert calls == [900_000, 900_000, 300_000, 3_000_000]  # a longer document goes alone
    assert packed.num_docs == 8


def test_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"content": ["x = 1\n", "print(x)\n"], "n": [1, 2]}), path)
    assert stream_of(path, text_field="content") == expected_stream(["x = 1\n", "print(x)\n"])


def test_folder_sorted_recursive_hidden_ignored(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("bee")
    (tmp_path / "a.txt").write_text("ay")
    write_jsonl(tmp_path / "sub" / "c.jsonl", [{"text": "sea"}, {"text": "see"}])
    (tmp_path / ".hidden.bin").write_bytes(b"\x00\xff")
    assert stream_of(tmp_path) == expected_stream(["ay", "bee", "sea", "see"])


def test_folder_links_to_folders_are_followed(tmp_path: Path) -> None:
    """A data folder assembled from links reads the linked folders' files too (Path.rglob would skip them),
    in the order of the paths as seen through the links."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.txt").write_text("ex")
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("ay")
    (data / "linked").symlink_to(outside, target_is_directory=True)
    (data / "z.txt").write_text("zed")
    assert [p.relative_to(data).as_posix() for p in sources.source_files(str(data))] == ["a.txt", "linked/x.txt", "z.txt"]
    assert stream_of(data) == expected_stream(["ay", "ex", "zed"])
    # Two links to one folder are two paths: each is read, as the user listed it twice.
    (data / "again").symlink_to(outside, target_is_directory=True)
    assert len(sources.source_files(str(data))) == 4


def test_rewritten_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("old text")
    assert stream_of(path) == expected_stream(["old text"])
    path.write_text("brand new text")
    assert stream_of(path) == expected_stream(["brand new text"])


# sha256 of the snapshot's documents joined by NUL: changes only when the snapshot is rebuilt
# on purpose (and then the golden loss curves in tests/golden must be regenerated too).
SNAPSHOT_DOCS_SHA256 = "aff249e3b905da8d80c56a096b3c4aaf0baa45d205c92a862d3b7f648da66455"


def _documents_digest(documents: tuple[str, ...]) -> str:
    return hashlib.sha256("\0".join(documents).encode("utf-8")).hexdigest()


def test_builtin_corpus_is_the_shipped_snapshot_not_this_python(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert SNAPSHOT_PATH.stat().st_size <= 5 * 1024 * 1024
    # The running interpreter's standard library is not read: point it at an empty folder.
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: {"stdlib": str(tmp_path)})
    builtin_documents.cache_clear()
    try:
        documents = builtin_documents()
    finally:
        builtin_documents.cache_clear()
    assert len(documents) == 218 and _documents_digest(documents) == SNAPSHOT_DOCS_SHA256


def test_builtin_corpus_script_rebuilds_the_snapshot_byte_for_byte(tmp_path: Path) -> None:
    script = REPO / "scripts" / "make_builtin_corpus.py"
    out = tmp_path / "corpus.json.xz"
    proc = subprocess.run([sys.executable, str(script), "--out", str(out)], capture_output=True, text=True, timeout=120)
    if platform.python_version() == "3.11.7":  # the version the snapshot is built from
        assert proc.returncode == 0, proc.stderr
        assert out.read_bytes() == SNAPSHOT_PATH.read_bytes()
    else:  # any other Python is refused, so a rebuild can never silently change the tokens
        assert proc.returncode == 2 and "built from Python 3.11.7" in proc.stderr and not out.exists()


def test_builtin_corpus_is_deterministic_and_fast() -> None:
    documents = builtin_documents()
    assert documents == builtin_documents()
    size = sum(len(d.encode()) for d in documents)
    assert 1_000_000 < size <= MAX_BYTES and len(documents) > 100
    assert any("def " in d for d in documents) and any("statement" in d for d in documents)
    clear_cache()
    start = time.perf_counter()
    train = build_dataloader(source="builtin", tokenizer=TOK, seq_len=256, local_batch_size=8)
    assert time.perf_counter() - start < 20  # about 0.4 s on one core; generous for a shared CI box
    val = build_dataloader(source="builtin", tokenizer=TOK, seq_len=256, local_batch_size=8, split="validation")
    inputs, labels = next(train)
    assert inputs.shape == labels.shape == (8, 256) and inputs.dtype == torch.int64
    assert train.num_tokens > 1_000_000 and val.num_windows >= 32


# ---- hub -----------------------------------------------------------------------------

def test_hub_needs_allow_download(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--data.allow_download=true"):
        loader("hf:someone/dataset")


def test_hub_streams_local_dataset_without_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("no network in tests")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    write_jsonl(tmp_path / "train.jsonl", [{"text": "alpha"}, {"text": "beta"}])
    assert stream_of(f"hf:{tmp_path}", allow_download=True) == expected_stream(["alpha", "beta"])


def test_hub_call_arguments_and_missing_field(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls: list[tuple[object, ...]] = []

    def fake_load(name: str, *, split: str, streaming: bool) -> list[dict[str, object]]:
        calls.append((name, split, streaming))
        return [{"content": "one", "meta": 1}, {"content": "two", "meta": 2}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    got = sources.read_documents("hf:org/name", text_field="content", hf_split="validation", allow_download=True)
    assert got == ["one", "two"] and calls == [("org/name", "validation", True)]
    with pytest.raises(ConfigError, match=r'no field "text" \(its fields: content, meta\)'):
        sources.read_documents("hf:org/name", text_field="text", allow_download=True)


# ---- errors -----------------------------------------------------------------------------

def test_error_messages(tmp_path: Path) -> None:
    cases: list[tuple[Path | str, str]] = []
    cases.append((tmp_path / "missing.jsonl", "does not exist"))
    (tmp_path / "empty_dir").mkdir()
    cases.append((tmp_path / "empty_dir", "holds no .txt/.jsonl/.json/.parquet files"))
    (tmp_path / "empty.txt").write_text("  \n")
    cases.append((tmp_path / "empty.txt", "contains no documents"))
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00\x01binary")
    cases.append((tmp_path / "bin.txt", "is not UTF-8 text (undecodable byte at offset 0)"))
    (tmp_path / "nul.txt").write_bytes(b"abc\x00def")
    cases.append((tmp_path / "nul.txt", "looks binary"))
    (tmp_path / "data.csv").write_text("text\nhello\n")
    cases.append((tmp_path / "data.csv", 'unsupported extension ".csv"'))
    write_jsonl(tmp_path / "fields.jsonl", [{"body": "x", "id": 1}])
    cases.append((tmp_path / "fields.jsonl", 'has no field "text" (its fields: body, id); set --data.text_field'))
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    cases.append((tmp_path / "bad.jsonl", "could not be read as JSON"))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    cases.append((tmp_path / "bad.parquet", "could not be read as Parquet"))
    write_jsonl(tmp_path / "ints.jsonl", [{"text": 5}])
    cases.append((tmp_path / "ints.jsonl", 'row 0 field "text" holds int'))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.txt").write_text("fine")
    (mixed / "notes.md").write_text("not data")
    cases.append((mixed, "unsupported extensions (notes.md)"))
    for source, message in cases:
        with pytest.raises(ConfigError) as info:
            loader(source)
        assert message in str(info.value), (source, str(info.value))
        assert Path(source).name in str(info.value)


def test_split_too_small(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("tiny")
    n = len(TOK.encode("tiny")) + 2
    with pytest.raises(ConfigError, match=rf"train split has {n} tokens in 1 documents, but one global batch needs 68 "):
        loader(tmp_path / "a.txt", local_batch_size=2, dp_world_size=2)


def test_empty_validation_split(corpus: Path) -> None:
    with pytest.raises(ConfigError, match=r"validation split is empty \(data.val_fraction=0.0"):
        loader(corpus, split="validation", val_fraction=0.0)


# ---- splits and windows -----------------------------------------------------------------

def _decode_docs(ids: list[int]) -> list[str]:
    text = TOK.decode(ids)
    return [d for d in text.replace("<|end_of_text|>", "").split("<|begin_of_text|>") if d]


def test_validation_split_is_disjoint_and_every_kth(tmp_path: Path) -> None:
    texts = docs(40)
    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts])
    packed = tokenized_source(str(tmp_path / "d.jsonl"), TOK, text_field="text", hf_split="train", allow_download=False)
    from titan_core.data.packing import split_stream

    train, n_train = split_stream(packed, split="train", val_fraction=0.1)
    val, n_val = split_stream(packed, split="validation", val_fraction=0.1)
    assert (n_train, n_val) == (36, 4)
    assert _decode_docs(val.tolist()) == [texts[i] for i in (9, 19, 29, 39)]
    assert set(_decode_docs(train.tolist())) == set(texts) - {texts[i] for i in (9, 19, 29, 39)}
    assert [i for i in range(300) if is_validation_doc(i, 0.01)] == [99, 199, 299]


def test_windows_shift_and_epoch_coverage(corpus: Path) -> None:
    dl = loader(corpus, seq_len=16, local_batch_size=4)
    stream = torch.tensor(expected_stream(docs(30)))
    windows = stream[: dl.num_windows * 17].view(-1, 17)
    seen: list[int] = []
    for _ in range(dl.batches_per_epoch):
        inputs, labels = next(dl)
        assert inputs.shape == labels.shape == (4, 16) and inputs.dtype == labels.dtype == torch.int64
        assert torch.equal(inputs[:, 1:], labels[:, :-1])
        for row_in, row_lab in zip(inputs, labels):
            full = torch.cat([row_in, row_lab[-1:]])
            (match,) = (windows == full).all(dim=1).nonzero().flatten().tolist()
            seen.append(match)
    # One epoch visits distinct windows in a shuffled order; the next epoch reshuffles.
    assert len(set(seen)) == len(seen) == dl.batches_per_epoch * 4
    assert seen != sorted(seen)
    assert dl.state_dict()["epoch"] == 0
    next(dl)
    assert dl.state_dict()["epoch"] == 1 and dl.state_dict()["window_offset"] == 4


def test_validation_is_sequential_and_resets(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in docs(40, words=80)])
    dl = loader(tmp_path / "d.jsonl", split="validation", val_fraction=0.25, local_batch_size=2)
    first, _ = next(dl)
    second, _ = next(dl)
    flat = torch.cat([first, second])
    packed = tokenized_source(str(tmp_path / "d.jsonl"), TOK, text_field="text", hf_split="train", allow_download=False)
    from titan_core.data.packing import split_stream

    val, _ = split_stream(packed, split="validation", val_fraction=0.25)
    assert torch.equal(flat, val[: 4 * 17].view(4, 17)[:, :-1].long())
    dl.reset()
    assert torch.equal(next(dl)[0], first)


def test_seed_changes_order(corpus: Path) -> None:
    a = next(loader(corpus, seed=0))[0]
    b = next(loader(corpus, seed=1))[0]
    assert not torch.equal(a, b)
    assert torch.equal(a, next(loader(corpus, seed=0))[0])


# ---- data parallelism and state ----------------------------------------------------------

def test_dp_ranks_equal_single_process_batches(corpus: Path) -> None:
    single = loader(corpus, local_batch_size=4)
    ranks = [loader(corpus, local_batch_size=2, dp_rank=r, dp_world_size=2) for r in range(2)]
    steps = single.batches_per_epoch + 5  # crosses an epoch boundary
    for _ in range(steps):
        x, y = next(single)
        parts = [next(r) for r in ranks]
        assert torch.equal(x, torch.cat([p[0] for p in parts]))
        assert torch.equal(y, torch.cat([p[1] for p in parts]))
    assert single.state_dict() == ranks[0].state_dict() == ranks[1].state_dict()
    assert single.state_dict()["epoch"] == 1


@pytest.mark.parametrize("stop_before_epoch_end", [False, True])
def test_state_restores_into_new_loader(corpus: Path, stop_before_epoch_end: bool) -> None:
    first = loader(corpus, local_batch_size=3, seed=5)
    k = first.batches_per_epoch - 2 if stop_before_epoch_end else 3
    for _ in range(k):
        next(first)
    state = first.state_dict()
    assert all(type(v) is int for v in state.values())
    expected = [next(first) for _ in range(6)]
    resumed = loader(corpus, local_batch_size=3, seed=5)
    resumed.load_state_dict(state)
    for (x, y), (rx, ry) in zip(expected, (next(resumed) for _ in range(6))):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    assert resumed.state_dict() == first.state_dict()
    if stop_before_epoch_end:
        assert resumed.state_dict()["epoch"] == 1


def test_two_rank_state_resumes_on_one_rank(corpus: Path) -> None:
    ranks = [loader(corpus, local_batch_size=2, dp_rank=r, dp_world_size=2) for r in range(2)]
    for _ in range(7):
        for r in ranks:
            next(r)
    state = ranks[0].state_dict()
    single = loader(corpus, local_batch_size=4)
    single.load_state_dict(state)
    for _ in range(3):
        x, y = next(single)
        parts = [next(r) for r in ranks]
        assert torch.equal(x, torch.cat([p[0] for p in parts])) and torch.equal(y, torch.cat([p[1] for p in parts]))


def test_state_from_other_data_is_refused(corpus: Path) -> None:
    state = loader(corpus, seq_len=16).state_dict()
    with pytest.raises(ConfigError, match=r"saved for \d+ windows .* training.seq_len changed"):
        loader(corpus, seq_len=8).load_state_dict(state)


def test_tokens_per_batch(corpus: Path) -> None:
    dl = loader(corpus, seq_len=16, local_batch_size=2, dp_world_size=2, dp_rank=1)
    assert dl.tokens_per_batch == 32 and dl.global_tokens_per_batch == 64 and dl.global_batch_size == 4


def test_bad_split_name(corpus: Path) -> None:
    with pytest.raises(ConfigError, match='split "test" is unknown'):
        loader(corpus, split="test")


@pytest.mark.parametrize("kind", ["tokens", "mixture"])
@pytest.mark.parametrize("dp_rank", [-1, 2])
def test_a_loader_refuses_a_data_parallel_rank_outside_its_world(kind: str, dp_rank: int) -> None:
    from titan_core.data.loader import TokenDataLoader
    from titan_core.data.mixture import MixtureDataLoader

    stream = torch.arange(400)
    layout = {"seq_len": 7, "local_batch_size": 2, "dp_rank": dp_rank, "dp_world_size": 2}
    with pytest.raises(ValueError, match=rf"dp_rank {dp_rank} is outside 0..1"):
        if kind == "tokens":
            TokenDataLoader(stream, **layout)
        else:
            MixtureDataLoader([("a", 1.0, stream), ("b", 3.0, stream)], **layout)
