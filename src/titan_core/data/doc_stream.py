"""Documents of a source, one at a time (for ``titan-data prepare``: no corpus is held in memory).

Yields the same documents, in the same order, as :func:`titan_core.data.sources.read_documents`
(empty and null rows skipped, a non-text value an error naming the row), but streams
``.jsonl`` line by line and ``.parquet`` batch by batch, and reads ``hf:`` datasets
with no size cap.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .corpus import builtin_documents
from .sources import HF_PREFIX, _quiet_datasets, _read_file, source_files


def _text(value: object, *, where: str, row: int, text_field: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f'{where}: row {row} field "{text_field}" holds {type(value).__name__}, not text; '
                          "set --text-field to a string field.")
    return value


def _field(record: object, *, where: str, row: int, text_field: str) -> Any:
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: row {row} is {type(record).__name__}, not an object with a \"{text_field}\" field.")
    if text_field not in record:
        raise ConfigError(f'{where}: row {row} has no field "{text_field}" (its fields: {", ".join(record) or "none"}); '
                          "set --text-field to the field that holds the text.")
    return record[text_field]


def _json_lines(path: Path, text_field: str) -> Iterator[str]:
    with path.open("rb") as f:
        for row, line in enumerate(f):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise ConfigError(f"data file {path} could not be read as JSON (line {row + 1}: {e}); "
                                  "fix the file or leave it out.") from None
            text = _text(_field(record, where=str(path), row=row, text_field=text_field), where=str(path), row=row,
                         text_field=text_field)
            if text is not None:
                yield text


def _json_file(path: Path, text_field: str) -> Iterator[str]:
    with path.open("rb") as f:
        head = f.read(1 << 16).lstrip()
    if not head.startswith(b"["):  # JSON lines in a .json file, as the datasets json builder reads it
        yield from _json_lines(path, text_field)
        return
    try:
        records = json.loads(path.read_bytes())
    except ValueError as e:
        raise ConfigError(f"data file {path} could not be read as JSON ({e}); fix the file or leave it out.") from None
    for row, record in enumerate(records):
        text = _text(_field(record, where=str(path), row=row, text_field=text_field), where=str(path), row=row,
                     text_field=text_field)
        if text is not None:
            yield text


def _parquet(path: Path, text_field: str) -> Iterator[str]:
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
    except Exception as e:  # pyarrow raises its own error types for a damaged file
        raise ConfigError(f"data file {path} could not be read as Parquet ({type(e).__name__}: {str(e)[:200]}); "
                          "fix the file or leave it out.") from None
    if text_field not in names:
        raise ConfigError(f'data file {path} has no field "{text_field}" (its fields: {", ".join(names) or "none"}); '
                          "set --text-field to the field that holds the text.")
    row = 0
    for batch in pf.iter_batches(columns=[text_field], batch_size=1024):
        for value in batch.column(0).to_pylist():
            text = _text(value, where=str(path), row=row, text_field=text_field)
            row += 1
            if text is not None:
                yield text


def _hub(name: str, *, text_field: str, split: str) -> Iterator[str]:
    with _quiet_datasets() as datasets:
        try:
            stream = datasets.load_dataset(name, split=split, streaming=True)
        except Exception as e:
            raise ConfigError(f'could not open hub dataset "{name}" (split "{split}"): {type(e).__name__}: '
                              f"{str(e)[:300]}; check the name, --hf-split and your network access.") from None
        for row, record in enumerate(stream):
            text = _text(_field(record, where=f"hf:{name}", row=row, text_field=text_field), where=f"hf:{name}",
                         row=row, text_field=text_field)
            if text is not None:
                yield text


def iter_documents(source: str, *, text_field: str, hf_split: str) -> Iterator[str]:
    """Every document of ``source`` in order (``source_files`` was checked by the caller for local sources)."""
    if source == "builtin":
        yield from builtin_documents()
        return
    if source.startswith(HF_PREFIX):
        yield from _hub(source[len(HF_PREFIX):], text_field=text_field, split=hf_split)
        return
    for path in source_files(source):
        suffix = path.suffix.lower()
        if suffix == ".txt":
            yield from _read_file(path, text_field=text_field)
        elif suffix == ".jsonl":
            yield from _json_lines(path, text_field)
        elif suffix == ".json":
            yield from _json_file(path, text_field)
        else:
            yield from _parquet(path, text_field)
