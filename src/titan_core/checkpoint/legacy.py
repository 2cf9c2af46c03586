"""Convert a checkpoint of the old format (DCP's pickled ``.metadata``) into the pickle-free one.

Resume never unpickles. This command does, once, on an explicit request for a
checkpoint the user trusts (their own older run), and writes a new folder that
resume reads without pickles::

    python -m titan_core.checkpoint.legacy --i-trust-this-checkpoint OLD/step-000100 NEW/step-000100

Non-tensor entries are still read with ``torch.load(weights_only=True)``; the
``.metadata`` pickle itself is read by DCP's own reader (which can run code: hence
the flag). The source folder is not changed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.planner import ReadItem

from ..errors import CheckpointError
from ..runtime.torch_compat import EmptyStateDictLoadPlanner, load_state_dict_in_process, set_element
from . import integrity, layout, storage
from .identity import CheckpointRecord, RunIdentity, write_record

TRUST_FLAG = "--i-trust-this-checkpoint"


class _WeightsOnlyEmptyPlanner(EmptyStateDictLoadPlanner):
    """Rebuilds the whole state from the metadata; non-tensor entries with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn],
                    torch.load(value, weights_only=True))


def convert_legacy_checkpoint(source: Path, target: Path) -> Path:
    """Write the old-format checkpoint ``source`` as a new-format checkpoint at ``target`` (a new folder)."""
    source, target = Path(source), Path(target)
    if not layout.is_legacy(source):
        raise CheckpointError(f"{source} is not an old-format checkpoint (no pickled .metadata without a "
                              f"tensor_index.json next to it); nothing to convert")
    if target.exists():
        raise CheckpointError(f"{target} already exists; pass a new folder for the converted checkpoint")
    try:
        old = json.loads((source / layout.IDENTITY_FILE).read_text(encoding="utf-8"))
        identity = RunIdentity.from_json(old["identity"])
        step, tokens, world = int(old["step"]), int(old["tokens_seen"]), int(old["world_size"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{source / layout.IDENTITY_FILE} is unreadable ({type(exc).__name__}: {exc})") from exc
    state: dict[str, Any] = {}
    planner = _WeightsOnlyEmptyPlanner()  # type: ignore[no-untyped-call]  # torch's planner __init__ is untyped
    load_state_dict_in_process(state, storage_reader=FileSystemReader(source), planner=planner)
    tensors, values, _ = storage.split_values(state)
    tmp = target.with_name(f".tmp-{target.name}-{secrets.token_hex(4)}")
    tmp.mkdir(parents=True)
    try:
        dcp.save(tensors, storage_writer=storage.IndexedWriter(tmp, values=storage.encode_values(values)), no_dist=True)
        files = integrity.digest_share(tmp, rank=0, world=1)
        write_record(tmp, CheckpointRecord(identity, step, tokens, world, files))
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m titan_core.checkpoint.legacy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(TRUST_FLAG, dest="trusted", action="store_true",
                        help="required: reading the old format unpickles .metadata, which can run code")
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    if not args.trusted:
        print(f"error: converting unpickles {args.source}/.metadata, which can run arbitrary code; pass "
              f"{TRUST_FLAG} only for a checkpoint you wrote yourself or otherwise trust", file=sys.stderr)
        return 2
    try:
        out = convert_legacy_checkpoint(args.source, args.target)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"converted {args.source} -> {out}; resume with --checkpoint.resume={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
