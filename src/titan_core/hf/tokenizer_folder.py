"""``--data.tokenizer=<Hugging Face folder>``: Llama 3's tokenizer as a model folder ships it.

* ``original/tokenizer.model`` (tiktoken ranks, as Meta ships Llama 3): read with the
  core's tiktoken tokenizer. The special tokens are those ``tokenizer.json`` lists after
  the ranks when it is present (so a folder exported by titan keeps its own), otherwise
  Llama 3's 256.
* only ``tokenizer.json``: read through the ``tokenizers`` library (the ``hf`` extra,
  ``pip install titan-core[hf]``). Text that spells a special token stays ordinary text,
  as with the tiktoken tokenizer, so documents cannot forge document boundaries.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..data.tokenizer import BOS_TOKEN, EOS_TOKEN, TiktokenTokenizer, llama3_special_tokens, read_bpe_ranks
from ..errors import ConfigError

WHAT = "data.tokenizer"


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: a number of over 4,300 digits too
        raise ConfigError(f"{WHAT}: cannot read {path}: {exc}") from None
    if not isinstance(data, dict):  # every tokenizer file of a Hugging Face folder is one object
        raise ConfigError(f"{WHAT}: {path} is not a JSON object (it holds a {type(data).__name__}); the folder is "
                          f"damaged, re-download its tokenizer files.")
    return data


def _specials_after(ranks_count: int, tokenizer_json: Path) -> list[str] | None:
    """Special tokens tokenizer.json places right after the ranks, in id order (None: no such list)."""
    data = _json(tokenizer_json)
    added = data.get("added_tokens")
    if not isinstance(added, list) or not added:
        return None
    try:
        by_id = sorted((int(t["id"]), str(t["content"])) for t in added)
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{WHAT}: {tokenizer_json} has a malformed added_tokens list.") from None
    ids = [i for i, _ in by_id]
    if ids != list(range(ranks_count, ranks_count + len(ids))):
        raise ConfigError(f"{WHAT}: {tokenizer_json} numbers its special tokens {ids[0]}..{ids[-1]}, but "
                          f"original/tokenizer.model has {ranks_count} ranks, so they should start at {ranks_count}; "
                          f"the two files do not belong together.")
    return [tok for _, tok in by_id]


def load_tokenizer_folder(folder: Path) -> TiktokenTokenizer | HFTokenizersTokenizer:
    folder = Path(folder)
    ranks_file = folder / "original" / "tokenizer.model"
    json_file = folder / "tokenizer.json"
    if ranks_file.is_file():
        ranks = read_bpe_ranks(ranks_file)
        specials = _specials_after(len(ranks), json_file) if json_file.is_file() else None
        tokenizer = TiktokenTokenizer(ranks, special_tokens=specials or llama3_special_tokens(), name=folder.name)
        return tokenizer
    if json_file.is_file():
        return HFTokenizersTokenizer(folder)
    raise ConfigError(f"{WHAT}: the folder {folder} has neither original/tokenizer.model nor tokenizer.json; point "
                      f"data.tokenizer at a Hugging Face model folder, a tokenizer.model file, or \"builtin\".")


class HFTokenizersTokenizer:
    """A ``tokenizer.json`` through the ``tokenizers`` library; satisfies titan_core's Tokenizer protocol."""

    def __init__(self, folder: Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ConfigError(f"{WHAT}: {folder} has only tokenizer.json, which needs the tokenizers package: "
                              f"pip install 'titan-core[hf]' (or add original/tokenizer.model).") from None
        try:
            self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # the library raises its own exception type for a bad file
            raise ConfigError(f"{WHAT}: cannot read {folder / 'tokenizer.json'}: {exc}") from None
        self._tok.encode_special_tokens = True  # special-token text stays ordinary text
        config_file = folder / "tokenizer_config.json"
        config = _json(config_file) if config_file.is_file() else {}
        self.name = folder.name
        self._bos = self._special_id(config.get("bos_token"), BOS_TOKEN)
        self._eos = self._special_id(config.get("eos_token"), EOS_TOKEN)

    def _special_id(self, configured: object, default: str) -> int:
        name = configured.get("content") if isinstance(configured, dict) else configured
        token = name if isinstance(name, str) else default
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise ConfigError(f"{WHAT}: tokenizer.json has no token {token!r} (needed for BOS/EOS).")
        return int(token_id)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def bos_id(self) -> int:
        return self._bos

    @property
    def eos_id(self) -> int:
        return self._eos

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        ids = list(self._tok.encode(text, add_special_tokens=False).ids)
        return ([self._bos] if bos else []) + ids + ([self._eos] if eos else [])

    def encode_batch(self, texts: list[str], *, num_threads: int = 4) -> list[list[int]]:
        # One document at a time: the library's own encode_batch runs on a thread pool whose
        # allocations stay in the process after the data is packed (measured: about 40 MiB more
        # resident for the whole run, malloc_trim or not), for no faster packing on 2 cores.
        del num_threads
        return [list(self._tok.encode(text, add_special_tokens=False).ids) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))
