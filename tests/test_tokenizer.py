"""The tiktoken-based tokenizer: Llama 3 file format, specials, the built-in vocabulary."""

from __future__ import annotations

import base64
import importlib.util
import socket
from pathlib import Path

import pytest
import tiktoken

from titan_core.data.tokenizer import (
    BUILTIN_PATH,
    LLAMA3_PATTERN,
    TiktokenTokenizer,
    _builtin,
    llama3_special_tokens,
    read_bpe_ranks,
    write_bpe_ranks,
)
from titan_core.errors import ConfigError
from titan_core.plan.tokenizer import build_tokenizer

from conftest import REPO

# Llama 3's published split pattern, typed out here as the reference.
REFERENCE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SAMPLES = [
    "",
    "Hello, world!",
    "naïve café — Größe, 東京タワー, emoji 🦙🔥 and combining e\u0301",
    "def f(x: int) -> int:\n\treturn x ** 2  # square\r\n\n\n",
    "   leading and trailing spaces   \n\t\t\n",
    "numbers 1234567 3.14159 0xDEADBEEF",
    "<|begin_of_text|> text that looks special <|end_of_text|><|eot_id|>",
]


def tiny_ranks() -> dict[bytes, int]:
    ranks = {bytes([b]): b for b in range(256)}
    for merge in [b"he", b"ll", b"hell", b"hello", b" w", b"or", b" wor", b"12", b"123", b"1234", b"in", b" in"]:
        ranks[merge] = len(ranks)
    return ranks


@pytest.fixture
def tiny_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokenizer.model"
    lines = [f"{base64.b64encode(t).decode()} {r}" for t, r in tiny_ranks().items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_llama3_special_tokens_order() -> None:
    specials = llama3_special_tokens()
    assert len(specials) == 256 and len(set(specials)) == 256
    assert specials[:10] == [
        "<|begin_of_text|>", "<|end_of_text|>",
        "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
        "<|reserved_special_token_2|>", "<|reserved_special_token_3|>",
        "<|start_header_id|>", "<|end_header_id|>",
        "<|reserved_special_token_4|>", "<|eot_id|>",
    ]
    assert specials[10] == "<|reserved_special_token_5|>"
    assert specials[-1] == "<|reserved_special_token_250|>"
    assert LLAMA3_PATTERN == REFERENCE_PATTERN


def test_file_tokenizer_matches_tiktoken_reference(tiny_file: Path) -> None:
    tok = TiktokenTokenizer.from_file(tiny_file)
    ranks = tiny_ranks()
    n = len(ranks)
    reference = tiktoken.Encoding(
        "reference",
        pat_str=REFERENCE_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={s: n + i for i, s in enumerate(llama3_special_tokens())},
    )
    for text in SAMPLES + ["hello world, hello wor in inn 12345"]:
        assert tok.encode(text) == reference.encode(text, disallowed_special=())
        assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == n + 256
    assert tok.bos_id == n and tok.eos_id == n + 1
    assert tok.special_id("<|eot_id|>") == n + 9
    # The split pattern really applies: digits go in groups of three, so "1234" is never used.
    assert tok.encode("12345") == [ranks[b"123"], ranks[b"4"], ranks[b"5"]]
    assert tok.encode("hello world")[:2] == [ranks[b"hello"], ranks[b" wor"]]


def test_bos_eos(tiny_file: Path) -> None:
    tok = TiktokenTokenizer.from_file(tiny_file)
    body = tok.encode("hello")
    assert tok.encode("hello", bos=True) == [tok.bos_id, *body]
    assert tok.encode("hello", eos=True) == [*body, tok.eos_id]
    assert tok.encode("hello", bos=True, eos=True) == [tok.bos_id, *body, tok.eos_id]
    assert tok.decode([tok.bos_id]) == "<|begin_of_text|>"


def test_special_token_text_stays_text() -> None:
    tok = build_tokenizer("builtin")
    for text in ["<|begin_of_text|>", "a <|end_of_text|> b", "<|eot_id|><|reserved_special_token_0|>"]:
        ids = tok.encode(text)
        assert all(i < 2038 for i in ids), ids
        assert tok.bos_id not in ids and tok.eos_id not in ids
        assert tok.decode(ids) == text


def test_builtin_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the built-in tokenizer must not touch the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    _builtin.cache_clear()
    tok = build_tokenizer("builtin")
    assert tok is build_tokenizer("builtin")  # cached per process
    assert tok.vocab_size == 2048
    assert (tok.bos_id, tok.eos_id) == (2038, 2039)
    assert tok.special_id("<|eot_id|>") == 2047
    ranks = read_bpe_ranks(BUILTIN_PATH)
    assert len(ranks) == 2038
    assert all(ranks[bytes([b])] == b for b in range(256))
    for text in SAMPLES:
        assert tok.decode(tok.encode(text)) == text
    # Trained on Python sources: common code words are single tokens.
    assert len(tok.encode(" return")) == 1 and len(tok.encode(" self")) == 1
    assert tok.encode_batch(["ab", "cd"]) == [tok.encode("ab"), tok.encode("cd")]


def test_build_tokenizer_from_path(tiny_file: Path) -> None:
    tok = build_tokenizer(str(tiny_file))
    assert tok.vocab_size == len(tiny_ranks()) + 256
    assert tok.fingerprint != build_tokenizer("builtin").fingerprint


def test_write_read_round_trip(tmp_path: Path) -> None:
    ranks = tiny_ranks()
    write_bpe_ranks(tmp_path / "t.model", ranks)
    assert read_bpe_ranks(tmp_path / "t.model") == ranks


def _lines(ranks: dict[bytes, int]) -> list[str]:
    return [f"{base64.b64encode(t).decode()} {r}" for t, r in ranks.items()]


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        (b"\x89PNG\r\n\x1a\n\x00\x00binary", "byte 0 is not ASCII"),
        (b"", "is empty"),
        ("AA== 0\nAQ== 1\nnot-a-line\n", "line 3 is not '<base64 token> <rank>'"),
        ("AA== 0\nAQ== 1\n@@@@ 2\n", "line 3 is not '<base64 token> <rank>'"),
        ("AA== 0\nAQ== x\n", "line 2 is not '<base64 token> <rank>'"),
        ("AA== 0\nAQ== 0\n", "line 2 repeats rank 0 (first on line 1)"),
        ("AA== 0\nAA== 1\n", "line 2 repeats token"),
        ("AA== 0\nAQ== 2\n", "rank 1 is missing"),
        ("\n".join(_lines({bytes([b]): b for b in range(255)})), "1 of the 256 single bytes have no token"),
    ],
)
def test_wrong_format_errors(tmp_path: Path, content: bytes | str | None, message: str) -> None:
    path = tmp_path / "tokenizer.model"
    if isinstance(content, str):
        path.write_text(content)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        TiktokenTokenizer.from_file(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)
    assert "data.tokenizer" in str(info.value)


def test_folder_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    # A folder is read as a Hugging Face model folder (tests/hf/test_tokenizer_folder.py).
    with pytest.raises(ConfigError, match="has neither original/tokenizer.model nor tokenizer.json"):
        build_tokenizer(str(tmp_path))


def _load_script():
    spec = importlib.util.spec_from_file_location("make_builtin_tokenizer", REPO / "scripts" / "make_builtin_tokenizer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bpe_trainer_merges_most_frequent_pairs() -> None:
    import collections

    script = _load_script()
    # pair (a,b): 3*2 + 2 = 8 occurrences; then (ab,ab): 3; (b,a) only 3 before the first merge.
    counts = collections.Counter({b"abab": 3, b"ab": 2, b"xy": 1})
    ranks = script.train_bpe(counts, 258)
    assert len(ranks) == 258
    assert ranks[b"ab"] == 256 and ranks[b"abab"] == 257
    tok = TiktokenTokenizer(ranks, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"])
    assert tok.encode("abab") == [257]
    assert tok.encode("abxy") == [256, ord("x"), ord("y")]


def test_bpe_trainer_on_pretokens_is_deterministic() -> None:
    script = _load_script()
    docs = ("the cat sat on the mat; the hat is flat. " * 20, "def the(cat): return cat\n" * 10)
    counts = script.count_pretokens(docs)
    assert counts[b" the"] == 20 * 3 - 1 + 10  # three per sentence, but the very first has no space
    first = script.train_bpe(counts, 280)
    assert first == script.train_bpe(counts, 280)
    assert sorted(first.values()) == list(range(280))
    assert first[b" the"] < first[b" flat"]  # the more frequent word is merged earlier
