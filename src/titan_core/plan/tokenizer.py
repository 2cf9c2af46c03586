"""``data.tokenizer`` -> a tokenizer: the built-in one, a Llama-3-format file, or a Hugging Face folder.

Above both readers (``tokenizer.py`` and ``hf/tokenizer_folder.py``, which builds on the first),
so neither has to know the other's callers.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..data.tokenizer import TiktokenTokenizer, _builtin

if TYPE_CHECKING:
    from ..hf.tokenizer_folder import HFTokenizersTokenizer


def build_tokenizer(source: str) -> TiktokenTokenizer | HFTokenizersTokenizer:
    """``"builtin"`` (cached per process), a Llama-3-format ``tokenizer.model``, or a Hugging Face folder."""
    if source == "builtin":
        return _builtin()
    path = Path(source).expanduser()
    if path.is_dir():  # a Hugging Face model folder
        from ..hf.tokenizer_folder import load_tokenizer_folder  # start-up: hf/ imports torch, prepare needs none

        return load_tokenizer_folder(path)
    return TiktokenTokenizer.from_file(path)
