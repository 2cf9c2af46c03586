"""``--data.tokenizer=<Hugging Face folder>`` encodes like the tiktoken file it came from."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from titan_core.data.tokenizer import BUILTIN_PATH, LLAMA3_NUM_SPECIAL_TOKENS
from titan_core.hf.tokenizer_folder import HFTokenizersTokenizer
from titan_core.hf.tokenizer_json import write_hf_tokenizer
from titan_core.plan.tokenizer import build_tokenizer

from conftest import assert_user_error

TEXTS = [
    "Hello world!  It's 12345 tokens\n\n  def f(x):\treturn x**2 # ünïcödé 日本語 ",
    "A document that spells <|end_of_text|> and <|begin_of_text|> keeps them as text.",
    (Path(__file__).resolve().parents[2] / "src/titan_core/train/trainer.py").read_text(),  # real code, long
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "model"
    write_hf_tokenizer(build_tokenizer("builtin"), out)
    return out


def test_folder_with_ranks_and_tokenizer_json_encodes_like_the_tiktoken_file(folder: Path) -> None:
    reference, tok = build_tokenizer("builtin"), build_tokenizer(str(folder))
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (reference.vocab_size, reference.bos_id, reference.eos_id)
    for text in TEXTS:
        assert tok.encode(text, bos=True, eos=True) == reference.encode(text, bos=True, eos=True)


def test_tokenizer_json_alone_goes_through_the_tokenizers_library(folder: Path, tmp_path: Path) -> None:
    only_json = tmp_path / "json_only"
    shutil.copytree(folder, only_json)
    shutil.rmtree(only_json / "original")
    reference, tok = build_tokenizer("builtin"), build_tokenizer(str(only_json))
    assert isinstance(tok, HFTokenizersTokenizer)
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (reference.vocab_size, reference.bos_id, reference.eos_id)
    for text in TEXTS:  # special-token text stays ordinary text here too
        assert tok.encode(text, bos=True) == reference.encode(text, bos=True)
        assert tok.decode(tok.encode(text)) == text


def test_meta_style_folder_gets_llama3_specials(tmp_path: Path) -> None:
    meta = tmp_path / "meta" / "original"
    meta.mkdir(parents=True)
    shutil.copy(BUILTIN_PATH, meta / "tokenizer.model")
    tok = build_tokenizer(str(tmp_path / "meta"))
    ranks = 2038
    assert tok.vocab_size == ranks + LLAMA3_NUM_SPECIAL_TOKENS
    assert (tok.bos_id, tok.eos_id, tok.special_id("<|eot_id|>")) == (ranks, ranks + 1, ranks + 9)
    assert tok.encode(TEXTS[0]) == build_tokenizer("builtin").encode(TEXTS[0])


def test_a_folder_without_a_tokenizer_is_one_message(tmp_path: Path, cli) -> None:
    (tmp_path / "empty").mkdir()
    result = cli(f"--data.tokenizer={tmp_path / 'empty'}", f"--job.run_dir={tmp_path / 'run'}", "--training.steps=1")
    assert_user_error(result, "has neither original/tokenizer.model nor tokenizer.json")
