"""Write a titan tokenizer (tiktoken BPE ranks) as the files ``transformers.AutoTokenizer`` reads.

``tokenizer.json`` is a byte-level BPE in the ``tokenizers`` format: the vocabulary is the
ranks with each byte shown through the usual printable byte alphabet, and the merges
are derived from the ranks (every split of a token into two tokens, ordered by the rank
of the token they make); with ``ignore_merges`` a piece that is itself a token is taken
whole, which is exactly tiktoken's rule, so both encode alike. The original ranks file
goes to ``original/tokenizer.model`` as Meta ships it. Written by hand (plain JSON), so
exporting needs no optional package.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from ..data.tokenizer import BOS_TOKEN, EOS_TOKEN, TiktokenTokenizer, write_bpe_ranks


@functools.lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """Byte -> one printable character: printable Latin-1 bytes stay themselves, the rest map past 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _show(token: bytes) -> str:
    alphabet = byte_alphabet()
    return "".join(alphabet[b] for b in token)


def bpe_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every split of each multi-byte token into two tokens, ordered by (token rank, left rank, right rank)."""
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    return [(left, right) for *_, left, right in merges]


def tokenizer_json(tokenizer: TiktokenTokenizer) -> dict[str, Any]:
    ranks = tokenizer.mergeable_ranks
    base = len(ranks)
    vocab = {_show(tok): rank for tok, rank in ranks.items()}
    added = [
        {"id": base + i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, tok in enumerate(tokenizer.special_tokens)
    ]
    bos = {"id": BOS_TOKEN, "ids": [tokenizer.bos_id], "tokens": [BOS_TOKEN]}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": tokenizer.pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ]},
        # As Llama 3: BOS in front of every encoded text.
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": BOS_TOKEN, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": BOS_TOKEN, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": BOS_TOKEN, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS_TOKEN: bos},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
            "vocab": vocab,
            "merges": [[_show(a), _show(b)] for a, b in bpe_merges(ranks)],
        },
    }


def write_hf_tokenizer(tokenizer: TiktokenTokenizer, folder: Path) -> None:
    """tokenizer.json, tokenizer_config.json, special_tokens_map.json and original/tokenizer.model."""
    folder = Path(folder)
    (folder / "original").mkdir(parents=True, exist_ok=True)
    write_bpe_ranks(folder / "original" / "tokenizer.model", tokenizer.mergeable_ranks)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(tokenizer), ensure_ascii=False), encoding="utf-8")
    base = len(tokenizer.mergeable_ranks)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "model_input_names": ["input_ids", "attention_mask"],
        "added_tokens_decoder": {
            str(base + i): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False,
                            "single_word": False, "special": True}
            for i, tok in enumerate(tokenizer.special_tokens)
        },
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN}, indent=1), encoding="utf-8")
