"""Byte-level BPE tokenizers on tiktoken, in Llama 3's file format and conventions.

Two sources, picked by ``data.tokenizer`` through ``build_tokenizer`` (``plan/tokenizer.py``, which also
reads Hugging Face folders):

* ``"builtin"``: a 2048-token byte-level BPE trained by the project on the
  built-in corpus (``scripts/make_builtin_tokenizer.py``). It ships inside the
  package (``titan_core/assets/builtin_tokenizer.model``), so nothing is
  downloaded. Its vocabulary is 2038 mergeable tokens (ranks 0..255 are the
  single bytes, so any text encodes) followed by the 10 special tokens in
  :data:`BUILTIN_SPECIAL_TOKENS` (the first ten of Llama 3's list: BOS, EOS,
  ``reserved_special_token_0..4``, ``start_header_id``, ``end_header_id``, ``eot_id``
  in Llama 3's order), ids 2038..2047.
* a path to a Llama-3-format ``tokenizer.model``: one ``<base64 token> <rank>``
  line per mergeable token, read with Llama 3's split pattern; Llama 3's 256
  special tokens follow the mergeable ranks (:func:`llama3_special_tokens`).

``encode`` treats all input as ordinary text: the text ``<|end_of_text|>`` in a
document becomes ordinary tokens, never the special id, so documents cannot
forge document boundaries. BOS/EOS are added only through ``bos=``/``eos=``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tiktoken

from ..errors import ConfigError
from .text_files import read_text_as

# Llama 3's pre-tokenizer split pattern (contractions, letter runs, 1-3 digits,
# punctuation runs, newlines, whitespace); tiktoken compiles it in Rust.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
LLAMA3_NUM_SPECIAL_TOKENS = 256
BUILTIN_VOCAB_SIZE = 2048
BUILTIN_PATH = Path(__file__).resolve().parents[1] / "assets" / "builtin_tokenizer.model"


def llama3_special_tokens() -> list[str]:
    """Llama 3's 256 special tokens, in the order they follow the mergeable ranks."""
    named = [
        BOS_TOKEN,
        EOS_TOKEN,
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|reserved_special_token_2|>",
        "<|reserved_special_token_3|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|reserved_special_token_4|>",
        "<|eot_id|>",
    ]
    # The remaining slots are numbered reserved tokens 5, 6, ... up to 256 in all.
    reserved = [f"<|reserved_special_token_{i}|>" for i in range(5, 5 + LLAMA3_NUM_SPECIAL_TOKENS - len(named))]
    return named + reserved


# The built-in tokenizer keeps Llama 3's first ten specials (same names, same
# order), so chat-style formatting written for Llama 3 also works with it.
BUILTIN_SPECIAL_TOKENS: tuple[str, ...] = tuple(llama3_special_tokens()[:10])


def read_bpe_ranks(path: str | Path) -> dict[bytes, int]:
    """Read a tiktoken BPE ranks file, raising ConfigError that names what is wrong."""
    path = Path(path)
    fix = "point data.tokenizer at a Llama-3-format tokenizer.model (or use \"builtin\")"
    if not path.exists():
        raise ConfigError(f"tokenizer file {path} does not exist; {fix}.")
    if not path.is_file():
        raise ConfigError(f"tokenizer path {path} is not a file; {fix}.")
    text = read_text_as(path, "ascii", lambda e: f"tokenizer file {path} is not a tiktoken BPE ranks file: byte "
                        f"{e.start} is not ASCII (a binary file such as a SentencePiece or HF tokenizer.json is not "
                        f"supported); {fix}.")
    ranks: dict[bytes, int] = {}
    seen_ranks: dict[int, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        token: bytes | None = None
        rank: int | None = None
        if len(parts) == 2 and parts[1].isdigit():
            try:
                # strict: anything but the base64 alphabet and its padding is refused (as b64decode's validate),
                # decoded natively, at half the cost of b64decode's pattern check on a 128k-line vocabulary
                token = binascii.a2b_base64(parts[0], strict_mode=True)
                rank = int(parts[1])
            except (binascii.Error, ValueError):
                token = None
        if token is None or rank is None or not token:
            raise ConfigError(
                f"tokenizer file {path}: line {lineno} is not '<base64 token> <rank>' "
                f"(got {line[:60]!r}); {fix}."
            )
        if rank in seen_ranks:
            raise ConfigError(
                f"tokenizer file {path}: line {lineno} repeats rank {rank} (first on line {seen_ranks[rank]}); "
                f"each rank must appear once; {fix}."
            )
        if token in ranks:
            raise ConfigError(
                f"tokenizer file {path}: line {lineno} repeats token {token!r} (rank {ranks[token]}); "
                f"each token must appear once; {fix}."
            )
        seen_ranks[rank] = lineno
        ranks[token] = rank
    if not ranks:
        raise ConfigError(f"tokenizer file {path} is empty (no '<base64 token> <rank>' lines); {fix}.")
    missing = next((r for r in range(len(ranks)) if r not in seen_ranks), None)
    if missing is not None:
        raise ConfigError(
            f"tokenizer file {path}: ranks must be 0..{len(ranks) - 1} without gaps, but rank {missing} is missing; {fix}."
        )
    # Byte-level BPE needs every single byte as a token, or some text cannot be encoded.
    absent = [b for b in range(256) if bytes([b]) not in ranks]
    if absent:
        raise ConfigError(
            f"tokenizer file {path}: {len(absent)} of the 256 single bytes have no token "
            f"(first missing: {bytes([absent[0]])!r}); a byte-level BPE needs all of them; {fix}."
        )
    return ranks


def write_bpe_ranks(path: str | Path, ranks: dict[bytes, int]) -> None:
    """Write ranks in the tiktoken / Llama 3 ``tokenizer.model`` format, sorted by rank."""
    lines = [f"{base64.b64encode(tok).decode('ascii')} {rank}\n" for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])]
    Path(path).write_text("".join(lines), encoding="ascii")


class TiktokenTokenizer:
    """A tiktoken byte-level BPE with special tokens placed after the mergeable ranks.

    Satisfies :class:`titan_core.plugin.protocols.Tokenizer`. ``fingerprint`` identifies the
    vocabulary (ranks + specials + pattern), so caches of token streams can be keyed on it.
    """

    def __init__(
        self,
        mergeable_ranks: dict[bytes, int],
        *,
        special_tokens: Sequence[str],
        pattern: str = LLAMA3_PATTERN,
        name: str = "custom",
    ) -> None:
        if BOS_TOKEN not in special_tokens or EOS_TOKEN not in special_tokens:
            raise ConfigError(f"tokenizer {name}: special tokens must include {BOS_TOKEN} and {EOS_TOKEN}.")
        base = len(mergeable_ranks)
        specials = {tok: base + i for i, tok in enumerate(special_tokens)}
        self.name = name
        self._enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=mergeable_ranks, special_tokens=specials)
        self._specials = specials
        self._vocab_size = base + len(specials)
        # Kept for exports (a Hugging Face tokenizer.json is derived from them).
        self.mergeable_ranks = mergeable_ranks
        self.special_tokens = list(special_tokens)
        self.pattern = pattern
        digest = hashlib.sha256(pattern.encode())
        # one update of the joined records hashes the same bytes as one update per token, faster
        in_rank_order = sorted(mergeable_ranks.items(), key=lambda kv: kv[1])
        digest.update(b"".join(len(tok).to_bytes(2, "little") + tok for tok, _ in in_rank_order))
        digest.update("\n".join(special_tokens).encode())
        self.fingerprint = digest.hexdigest()[:16]

    @classmethod
    def from_file(cls, path: str | Path, *, special_tokens: Sequence[str] | None = None) -> TiktokenTokenizer:
        """Load a Llama-3-format ``tokenizer.model``; specials default to Llama 3's 256."""
        ranks = read_bpe_ranks(path)
        specials = list(special_tokens) if special_tokens is not None else llama3_special_tokens()
        return cls(ranks, special_tokens=specials, name=Path(path).name)

    @classmethod
    def builtin(cls) -> TiktokenTokenizer:
        """The shipped 2048-token tokenizer (no download)."""
        return _builtin()

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def bos_id(self) -> int:
        return self._specials[BOS_TOKEN]

    @property
    def eos_id(self) -> int:
        return self._specials[EOS_TOKEN]

    def special_id(self, token: str) -> int:
        """The id of a special token such as ``<|eot_id|>``."""
        return self._specials[token]

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        # encode_ordinary == encode(disallowed_special=()): special-token text stays text.
        ids = self._enc.encode_ordinary(text)
        if bos:
            ids.insert(0, self.bos_id)
        if eos:
            ids.append(self.eos_id)
        return ids

    def encode_array(self, text: str) -> Any:
        """``encode(text)`` as a uint32 numpy array, made without a Python int per token (titan-data prepare)."""
        try:
            return self._enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=())
        except UnicodeEncodeError:  # a lone surrogate: encode_ordinary's own repair, then the list path
            import numpy as np

            return np.asarray(self.encode(text), dtype=np.uint32)

    def encode_batch(self, texts: list[str], *, num_threads: int = 4) -> list[list[int]]:
        """Encode many texts as ordinary text (no BOS/EOS), in tiktoken's thread pool."""
        return self._enc.encode_ordinary_batch(texts, num_threads=num_threads)

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))

    def __repr__(self) -> str:
        return f"TiktokenTokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


@functools.lru_cache(maxsize=1)
def _builtin() -> TiktokenTokenizer:
    if not BUILTIN_PATH.is_file():
        raise ConfigError(
            f"the built-in tokenizer file {BUILTIN_PATH} is missing from the installation; "
            "reinstall titan-core or regenerate it with scripts/make_builtin_tokenizer.py."
        )
    tok = TiktokenTokenizer.from_file(BUILTIN_PATH, special_tokens=BUILTIN_SPECIAL_TOKENS)
    tok.name = "builtin"
    return tok
