"""What ``titan-data prepare`` checks before it writes: its settings, where ``--out`` lies, and the
records an earlier prepare left in ``--out`` (``prepare.json``, ``index.json``), which are files a
person may have edited. Each problem is one :class:`ConfigError` naming the file or flag and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..sources import HF_PREFIX

MAX_SHARD_TOKENS = 1 << 31  # two buffers of this many tokens are held in memory (16 GB at uint32)
# Below this a shard holds a handful of documents: a corpus becomes tens of thousands of files (and as
# many opens, hashes and index entries) for no gain.
MIN_SHARD_TOKENS = 512


def max_workers() -> int:
    """More tokenizer processes than this only share the same cores (and each holds a tokenizer)."""
    return max(8, 4 * (os.cpu_count() or 1))


def check_settings(workers: int, shard_tokens: int, hf_timeout_s: float = 60.0) -> None:
    if not (0 < hf_timeout_s <= 86400):  # NaN fails too
        raise ConfigError(f"--hf-timeout {hf_timeout_s}: give the seconds an hf: source may stay silent, above 0 "
                          "and at most 86400 (a day), e.g. --hf-timeout 60.")
    if workers < 1:
        raise ConfigError(f"--workers {workers}: give at least 1 worker process.")
    if workers > max_workers():
        raise ConfigError(f"--workers {workers}: at most {max_workers()} on this machine ({os.cpu_count()} CPUs); "
                          "more processes than cores only share them.")
    if shard_tokens < MIN_SHARD_TOKENS:
        raise ConfigError(f"--shard-tokens {shard_tokens}: at least {MIN_SHARD_TOKENS} tokens per shard (smaller "
                          "shards only make thousands of files); the default 2^26 suits any corpus.")
    if shard_tokens > MAX_SHARD_TOKENS:
        raise ConfigError(f"--shard-tokens {shard_tokens}: at most {MAX_SHARD_TOKENS} (2^31; two shard buffers are "
                          "held in memory); the default 2^26 suits any corpus.")


def check_out_place(out: Path, sources: list[str]) -> None:
    """``--out`` must not be a dangling link, nor lie inside a source folder (its shards would become part
    of that source: the next prepare, or a trainer reading the folder, would refuse their .bin files)."""
    if out.is_symlink() and not out.exists():
        raise ConfigError(f"--out {out} is a link to {os.readlink(out)}, which does not exist; give a folder.")
    where = out.expanduser().resolve()
    for source in sources:
        if source == "builtin" or source.startswith(HF_PREFIX):
            continue
        folder = Path(source).expanduser().resolve()
        if folder.is_dir() and (where == folder or folder in where.parents):
            raise ConfigError(f"--out {out} lies inside the source folder {source}; the shards would be read as "
                              "part of that source next time. Give an --out outside it.")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_saved_progress(out: Path, saved: dict[str, Any], shard_tokens: int, itemsize: int, name: str) -> None:
    """``prepare.json`` of an unfinished prepare: the shards it lists are the full ones on disk, in order,
    and its resume point is counts (a file edited by hand is refused, never continued from)."""
    def damaged(what: str) -> ConfigError:
        return ConfigError(f"--out {out}: its {name} is damaged ({what}); delete the folder and prepare again.")

    shards = saved.get("shards")
    if not isinstance(shards, list):
        raise damaged("no list of shards")
    for i, record in enumerate(shards):
        if not isinstance(record, dict) or record.get("file") != f"shard-{i:05d}.bin" \
                or record.get("tokens") != shard_tokens or not isinstance(record.get("sha256"), str):
            raise damaged(f"shard entry {i} is not shard-{i:05d}.bin of {shard_tokens} tokens")
        path = out / record["file"]
        if not path.is_file() or path.stat().st_size != shard_tokens * itemsize:
            raise damaged(f"{record['file']} is missing or not a whole shard")
    if not _count(saved.get("next_doc")) or not _count(saved.get("skip")):
        raise damaged(f"next_doc {saved.get('next_doc')!r} and skip {saved.get('skip')!r} are not counts")
    task = saved.get("task")
    if task is not None and not (isinstance(task, dict) and _count(task.get("index")) and _count(task.get("first_doc"))):
        raise damaged(f"task {task!r} is not an index and a document count")


def check_finished_index(out: Path, index: dict[str, Any]) -> None:
    """A finished ``index.json`` whose inputs match: the counts the summary line prints are counts."""
    if not (_count(index.get("num_tokens")) and _count(index.get("num_documents"))
            and isinstance(index.get("shards"), list) and isinstance(index.get("dtype"), str)):
        raise ConfigError(f"--out {out}: its index.json names these inputs but its counts are damaged; delete the "
                          "folder and prepare again.")
