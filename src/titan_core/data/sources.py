"""Reading documents from ``data.source``: the built-in corpus, local files, or the hub.

Local sources (read through the ``datasets`` library, except ``.txt``):

* ``.txt``: the whole file is one document (UTF-8);
* ``.jsonl`` / ``.json``: one document per row, text in ``data.text_field``;
* ``.parquet``: one document per row, text in ``data.text_field``;
* a folder: every such file below it, in sorted path order (hidden files are
  ignored, links to folders are followed; any other file is an error, so nothing
  is silently left out).

Rows whose text is null or empty are skipped. ``hf:<name>`` streams a Hugging Face
hub dataset; it is refused unless ``data.allow_download`` is true, and it reads at
most :data:`HF_MAX_BYTES` of text (the loader tokenizes its whole split in memory).

Every user mistake raises :class:`ConfigError` naming the path and the fix.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ..console import env_is_rank0, progress
from ..errors import ConfigError
from ..runtime.os_errors import file_kind
from .corpus import builtin_documents
from .deadline import stall_deadline
from .json_lines import read_json_list, read_jsonl
from .text_rules import decode_utf8

SUPPORTED_SUFFIXES = (".txt", ".jsonl", ".json", ".parquet")
HF_PREFIX = "hf:"
HF_MAX_BYTES = 256 * 1024 * 1024
_BUILDER = {".parquet": "parquet"}  # .txt, .jsonl and .json are read directly (_read_file)
# data.hf_timeout_s, set from the run's config (set_hf_timeout); the default is the field's.
_HF_TIMEOUT_S = [60.0]


def set_hf_timeout(seconds: float) -> None:
    _HF_TIMEOUT_S[0] = seconds


def source_files(source: str) -> list[Path]:
    """The files a local source names, sorted; ConfigError when there are none or one is unsupported."""
    path = Path(source).expanduser()
    if not path.exists():
        raise ConfigError(
            f'data.source "{source}" does not exist; give an existing .txt/.jsonl/.json/.parquet file or folder, '
            '"builtin", or "hf:<name>".'
        )
    if not path.is_file() and not path.is_dir():
        raise ConfigError(
            f'data.source "{source}" is {file_kind(path)}, not a regular file or folder; point data.source at '
            f".txt/.jsonl/.json/.parquet files (a pipe or device cannot be re-read for validation and resume)."
        )
    if path.is_file():
        if path.suffix.lower() not in SUPPORTED_SUFFIXES:
            raise ConfigError(
                f'data.source "{source}" has the unsupported extension "{path.suffix}"; '
                f"supported: {', '.join(SUPPORTED_SUFFIXES)} (or a folder of such files)."
            )
        return [path]
    visible = _visible_entries(path, source)
    # Nothing is silently left out: a dangling link or a pipe in the folder is an error, not a skip.
    odd = [p for p in visible if not p.is_file() and not p.is_dir()]
    if odd:
        names = ", ".join(f"{p.relative_to(path).as_posix()} ({file_kind(p)})" for p in odd[:3])
        raise ConfigError(
            f'data.source folder "{source}" holds {len(odd)} entr{"y" if len(odd) == 1 else "ies"} that cannot be '
            f"read as data: {names}. Remove them, fix the links, or point data.source at another folder."
        )
    files = sorted((p for p in visible if p.is_file()), key=lambda p: p.relative_to(path).as_posix())
    unsupported = [p for p in files if p.suffix.lower() not in SUPPORTED_SUFFIXES]
    if unsupported:
        names = ", ".join(p.relative_to(path).as_posix() for p in unsupported[:3])
        raise ConfigError(
            f'data.source folder "{source}" holds {len(unsupported)} file(s) with unsupported extensions ({names}); '
            f"supported: {', '.join(SUPPORTED_SUFFIXES)}. Move them out or point data.source at one file."
        )
    if not files:
        raise ConfigError(f'data.source folder "{source}" holds no .txt/.jsonl/.json/.parquet files; add some or pick another source.')
    return files


def _visible_entries(root: Path, source: str) -> list[Path]:
    """Every entry below ``root`` whose path has no hidden part, following links to folders (a data
    folder assembled from links is common, and Path.rglob would skip their contents without a word).
    A link back into a folder already being walked is an error: it would read the same files forever."""
    entries: list[Path] = []
    stack: list[tuple[Path, tuple[tuple[int, int], ...]]] = [(root, ())]
    while stack:
        folder, ancestors = stack.pop()
        try:
            st = folder.stat()
            children = sorted(folder.iterdir())
        except OSError as e:
            raise ConfigError(
                f'data.source folder "{source}": cannot list {folder} ({e.strerror or e}); fix its permissions '
                "or move it out."
            ) from None
        here = (*ancestors, (st.st_dev, st.st_ino))
        for child in children:
            if child.name.startswith("."):
                continue
            entries.append(child)
            if child.is_dir():
                cst = child.stat()
                if (cst.st_dev, cst.st_ino) in here:
                    raise ConfigError(
                        f'data.source folder "{source}": {child.relative_to(root).as_posix()} links back to a folder '
                        "that contains it (a loop); remove that link."
                    )
                stack.append((child, here))
    return entries


def read_documents(source: str, *, text_field: str = "text", hf_split: str = "train", allow_download: bool = False) -> list[str]:
    """All documents of ``source`` in a deterministic order (see the module docstring)."""
    if source == "builtin":
        return list(builtin_documents())
    if source.startswith(HF_PREFIX):
        return _read_hub(source[len(HF_PREFIX):], text_field=text_field, split=hf_split, allow_download=allow_download)
    docs = _read_files(source_files(source), text_field=text_field, source=source)
    if not docs:
        raise ConfigError(f'data.source "{source}" contains no documents (every file or row is empty); add text or pick another source.')
    return docs


PROGRESS_EVERY_S = 2.0
PROGRESS_MIN_FILES = 100  # a folder with this many files says what it reads, and how long it took


def _read_files(files: list[Path], *, text_field: str, source: str) -> list[str]:
    """Every file's documents in order; for a folder of many files (or a slow read) progress lines on stderr."""
    is_rank0 = env_is_rank0()
    many = len(files) >= PROGRESS_MIN_FILES
    if many:
        progress(f"reading data.source {source}: {len(files):,} files", is_rank0=is_rank0)
    docs: list[str] = []
    start = last = time.monotonic()
    for i, path in enumerate(files, 1):
        docs.extend(_read_file(path, text_field=text_field))
        now = time.monotonic()
        if now - last >= PROGRESS_EVERY_S and i < len(files):
            last = now
            progress(f"reading data.source {source}: {i:,} of {len(files):,} files, {len(docs):,} documents so far",
                     is_rank0=is_rank0)
    if many or time.monotonic() - start >= PROGRESS_EVERY_S:
        progress(f"read data.source {source}: {len(files):,} files, {len(docs):,} documents in "
                 f"{time.monotonic() - start:.1f} s", is_rank0=is_rank0)
    return docs


def _read_file(path: Path, *, text_field: str) -> list[str]:
    if path.suffix.lower() == ".txt":
        text = decode_utf8(path.read_bytes(), path=path)  # text_rules.py: the BOM and UTF-8 rules prepare reads by
        if "\x00" in text:
            raise ConfigError(f"data file {path} looks binary (it contains NUL bytes); give a text file.")
        return [text] if text.strip() else []

    suffix = path.suffix.lower()
    if suffix == ".jsonl":  # read directly: one datasets load per file made a folder of small files take minutes
        return read_jsonl(path, text_field=text_field)
    if suffix == ".json":
        listed = read_json_list(path, text_field=text_field)
        if listed is not None:
            return listed
        # Anything else is read as JSON lines, and refused naming the line where it is not: the two forms
        # titan-data prepare packs (doc_stream.py). datasets used to take other forms (one object over
        # several lines, columns of lists), so a file trained here could not be prepared.
        return read_jsonl(path, text_field=text_field)
    return _read_table(path, builder=_BUILDER[suffix], text_field=text_field)


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[Any]:
    """Import ``datasets`` with its progress bars off and its own error log silenced for the duration
    (restored after): a file it cannot parse is reported once, by us, naming the file; datasets would
    also log pyarrow's traceback."""
    import logging

    import datasets

    was_disabled = datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    log = logging.getLogger("datasets")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield datasets
    finally:
        log.setLevel(level)
        if not was_disabled:
            datasets.enable_progress_bars()


def _read_table(path: Path, *, builder: str, text_field: str) -> list[str]:
    kind = "JSON" if builder == "json" else "Parquet"
    # A throwaway cache folder: the rows are copied out, and ~/.cache stays clean.
    import tempfile  # here, not at the top: only the datasets path needs it, and prepare's start-up counts

    with _quiet_datasets() as datasets, tempfile.TemporaryDirectory(prefix="titan-ds-") as cache:
        try:
            table = datasets.load_dataset(builder, data_files=[str(path)], split="train", cache_dir=cache)
        except Exception as e:  # datasets wraps pyarrow's parse errors in its own types
            cause = e.__cause__ or e
            raise ConfigError(
                f"data file {path} could not be read as {kind} ({type(cause).__name__}: {str(cause)[:200]}); "
                f"fix the file or remove it from data.source."
            ) from None
        if text_field not in table.column_names:
            raise ConfigError(
                f'data file {path} has no field "{text_field}" (its fields: {", ".join(table.column_names) or "none"}); '
                "set --data.text_field to the field that holds the text."
            )
        return _texts(table[text_field], where=str(path), text_field=text_field)


def _texts(values: Iterable[Any], *, where: str, text_field: str, max_bytes: int | None = None) -> list[str]:
    docs: list[str] = []
    total = 0
    for row, value in enumerate(values):
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise ConfigError(
                f'{where}: row {row} field "{text_field}" holds {type(value).__name__}, not text; '
                "set --data.text_field to a string field."
            )
        docs.append(value)
        total += len(value)
        if max_bytes is not None and total >= max_bytes:
            break
    return docs


def _read_hub(name: str, *, text_field: str, split: str, allow_download: bool) -> list[str]:
    if not allow_download:
        raise ConfigError(
            f'data.source "hf:{name}" needs a download from the Hugging Face hub, which is off by default; '
            "set --data.allow_download=true to permit it, or use a local file or folder."
        )
    import datasets  # noqa: F401  (imported before the clock starts: a slow import is not a silent server)

    # Every network read is bounded: a hub or proxy that accepts the connection and then never answers
    # would otherwise hold the run (and every rank) forever, in silence.
    return stall_deadline(lambda tick: _stream_hub(name, text_field=text_field, split=split, tick=tick),
                          seconds=_HF_TIMEOUT_S[0], source=f"hf:{name}")


def _stream_hub(name: str, *, text_field: str, split: str, tick: Callable[[int], None]) -> list[str]:
    with _quiet_datasets() as datasets:
        try:
            stream = datasets.load_dataset(name, split=split, streaming=True)
            first = next(iter(stream), None)
        except Exception as e:
            raise ConfigError(
                f'could not open hub dataset "{name}" (split "{split}"): {type(e).__name__}: {str(e)[:300]}; '
                "check the name, data.hf_split and your network access."
            ) from None
        if first is None:
            raise ConfigError(f'hub dataset "{name}" split "{split}" has no rows; pick another dataset or data.hf_split.')
        if text_field not in first:
            raise ConfigError(
                f'hub dataset "{name}" has no field "{text_field}" (its fields: {", ".join(first)}); '
                "set --data.text_field to the field that holds the text."
            )

        def rows() -> Iterator[Any]:
            for i, row in enumerate(stream):
                tick(i + 1)
                yield row[text_field]

        docs = _texts(rows(), where=f"hf:{name}", text_field=text_field, max_bytes=HF_MAX_BYTES)
    if not docs:
        raise ConfigError(f'hub dataset "{name}" split "{split}" contains no documents in field "{text_field}".')
    return docs
