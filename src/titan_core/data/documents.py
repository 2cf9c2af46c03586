"""Document boundaries inside packed windows (``data.document_masking``).

The packer writes every document as ``[BOS] tokens [EOS]`` and concatenates them
(``packing.py``), so inside a window a new document begins right after each EOS
token, and at the window's first token (a document cut by the window edge is, for
the model, a document of its own). From that this module derives, per token:

* its position in its document (0 at each document's first token), which the model
  takes as ``forward(tokens, positions=...)``: it restarts RoPE there and attends
  only within the document (keys ``i - positions[i] .. i``);
* the labels with ``IGNORE_INDEX`` where the input is an EOS: that label is the next
  document's first token, which nothing in the previous document predicts (with a
  tokenizer whose BOS is its EOS, see ``document_ends``).

Pure tensor code on the loader's CPU batches: no sync with an accelerator.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..models.loss import IGNORE_INDEX
from ..models.loss_terms import forward_declares

#: the keyword argument of the model's forward that receives the positions
POSITIONS_KWARG = "positions"


def document_ends(inputs: torch.Tensor, labels: torch.Tensor, *, eos_id: int, bos_id: int) -> torch.Tensor:
    """Where a document ends, bool [b, s]: the input is an EOS and its label opens the next document.

    With distinct BOS and EOS every EOS ends a document. A tokenizer whose BOS is its EOS
    (GPT-2's ``<|endoftext|>``) packs ``... EOS BOS ...`` as two equal tokens: only the
    first of such a pair ends a document, so a BOS stays with the text it opens.
    """
    ends = inputs == eos_id
    return ends & (labels == bos_id) if bos_id == eos_id else ends


def document_positions(ends: torch.Tensor) -> torch.Tensor:
    """Each token's position in its document, int64 [b, s], from ``document_ends``."""
    seq = ends.shape[-1]
    index = torch.arange(seq, device=ends.device).expand(ends.shape)
    starts_here = torch.zeros_like(ends)
    starts_here[..., 0] = True
    starts_here[..., 1:] = ends[..., :-1]
    # The latest document start at or before each token (a running max of start indices).
    starts = torch.where(starts_here, index, 0).cummax(dim=-1).values
    return index - starts


def split_documents(inputs: torch.Tensor, labels: torch.Tensor, *, eos_id: int,
                    bos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions for the model's forward, labels with ``IGNORE_INDEX`` at every document's end).

    The label of a document's last token (its EOS) is the next document's first token,
    which nothing the model may see predicts: it is ignored.
    """
    ends = document_ends(inputs, labels, eos_id=eos_id, bos_id=bos_id)
    return document_positions(ends), labels.masked_fill(ends, IGNORE_INDEX)


def accepts_positions(model_cls: type) -> bool:
    """Whether ``model_cls.forward`` declares the ``positions`` keyword (``**kwargs`` is not a declaration)."""
    return forward_declares(model_cls, POSITIONS_KWARG)


def check_document_masking(*, spec_name: str, model_cls: type, pp: int, pipeline_takes_positions: bool) -> None:
    """ConfigError when ``data.document_masking=true`` cannot be honoured by this spec and layout."""
    if not accepts_positions(model_cls):
        raise ConfigError(
            f'data.document_masking=true: the model of spec "{spec_name}" ({model_cls.__name__}) does not accept '
            f"the `{POSITIONS_KWARG}` keyword argument in its forward, so it cannot keep documents apart. Set "
            f"--data.document_masking=false, or give its forward a `{POSITIONS_KWARG}=None` parameter "
            "(docs/writing-a-train-spec.md, \"Packed documents\")."
        )
    if pp > 1 and not pipeline_takes_positions:
        raise ConfigError(
            f'data.document_masking=true is not supported with pipeline parallelism (parallelism.pp={pp}) by spec '
            f'"{spec_name}": its pipeline stages do not declare that they take the document positions '
            "(TrainSpec.pipeline_takes_positions). Use --parallelism.pp=1 (FSDP and TP work with it), or turn "
            "document masking off."
        )
