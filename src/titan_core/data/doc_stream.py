"""Documents of a source, read a piece at a time (for ``titan-data prepare``: no corpus is held in memory).

Together the pieces yield the same documents, in the same order, as
:func:`titan_core.data.sources.read_documents` (empty and null rows skipped, a non-text value
an error naming the row: ``text_rules.py``, the trainer's readers' rules), but a ``.jsonl`` file is read as byte ranges of whole lines, a
``.parquet`` file row group by row group, and ``hf:`` datasets are streamed with no size cap.
A piece is named by where it lies (file, byte range, row group), so a worker process can read
it itself: the text never passes through the process that hands out the work.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from ..errors import ConfigError
from .sources import _quiet_datasets
from .text_rules import decode_utf8, row_text, value_text, without_bom

FLAG = "--text-field"  # titan-data prepare's name for the text field


# ---- .jsonl (and JSON lines in a .json file) ----------------------------------------------------------


def line_ranges(path: Path, size: int, target: int) -> Iterator[tuple[int, int]]:
    """``[start, end)`` byte ranges of about ``target`` bytes, each ending just after a newline (or at
    the end): they depend on the file alone. Only a few bytes around each cut are read."""
    with path.open("rb") as f:
        start = 0
        while start < size:
            end = start + target
            if end >= size:
                yield start, size
                return
            f.seek(end - 1)  # the cut goes after the first newline at or after end - 1
            while True:
                block = f.read(1 << 16)
                if not block:
                    end = size
                    break
                newline = block.find(b"\n")
                if newline >= 0:
                    end = f.tell() - len(block) + newline + 1
                    break
            yield start, end
            start = end


def lines_before(path: Path, offset: int) -> int:
    """Lines before byte ``offset`` (only for a message: the line of a bad row, or of a repeated document)."""
    count = 0
    with path.open("rb") as f:
        while offset > 0:
            block = f.read(min(offset, 1 << 20))
            if not block:
                break
            count += block.count(b"\n")
            offset -= len(block)
    return count


def json_lines(path: Path, start: int, end: int, text_field: str) -> Iterator[tuple[int, str]]:
    """The texts of the lines in bytes ``[start, end)`` of ``path`` (a range from :func:`line_ranges`), each
    with the byte offset of its line in the file (a line number would cost a read of the file up to it)."""
    with path.open("rb") as f:
        f.seek(start)
        data = f.read(end - start)
    offset = start
    for i, line in enumerate(data.split(b"\n")):
        at, offset = offset, offset + len(line) + 1
        if not line.strip():
            continue
        try:
            record = json.loads(decode_utf8(line, path=path, line=i + 1))  # the line number is corrected below
        except (ValueError, RecursionError, ConfigError) as e:  # RecursionError: nested too deep for the parser
            number = lines_before(path, start) + i + 1  # only now: counting costs a read of the file up to here
            decode_utf8(line, path=path, line=number)  # invalid UTF-8: refused as the trainer refuses it
            raise ConfigError(f"data file {path} could not be read as JSON (line {number}: {e}); fix the file or "
                              "leave it out.") from None
        if not isinstance(record, dict) or text_field not in record or not isinstance(record[text_field], (str, type(None))):
            number = lines_before(path, start) + i + 1
            row_text(record, where=f"data file {path} line {number}", row=number - 1, text_field=text_field, flag=FLAG)
        text = record[text_field]
        if text:
            yield at, text


def json_is_list(path: Path) -> bool:
    """Whether a ``.json`` file holds one JSON list (else JSON lines, as the datasets json builder reads it)."""
    with path.open("rb") as f:
        return without_bom(f.read(1 << 16)).lstrip().startswith(b"[")


def json_list(path: Path, text_field: str) -> Iterator[str]:
    try:
        records = json.loads(decode_utf8(path.read_bytes(), path=path))
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"data file {path} could not be read as JSON ({e}); fix the file or leave it out.") from None
    for row, record in enumerate(records):
        text = row_text(record, where=f"data file {path}", row=row, text_field=text_field, flag=FLAG)
        if text is not None:
            yield text


# ---- .parquet ------------------------------------------------------------------------------------------


def parquet_row_groups(path: Path, text_field: str) -> list[int]:
    """The row count of each row group; ConfigError for a file that is not Parquet or lacks the field."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        rows = [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)]
    except Exception as e:  # pyarrow raises its own error types for a damaged file
        raise ConfigError(f"data file {path} could not be read as Parquet ({type(e).__name__}: {str(e)[:200]}); "
                          "fix the file or leave it out.") from None
    if text_field not in names:
        raise ConfigError(f'data file {path} has no field "{text_field}" (its fields: {", ".join(names) or "none"}); '
                          "set --text-field to the field that holds the text.")
    return [int(n) for n in rows]


def parquet_group(path: Path, group: int, first_row: int, text_field: str) -> Iterator[tuple[int, str]]:
    """The texts of row group ``group`` (whose first row is ``first_row`` of the file), each with its row."""
    import pyarrow.parquet as pq

    try:
        values = pq.ParquetFile(path).read_row_group(group, columns=[text_field]).column(0).to_pylist()
    except Exception as e:
        raise ConfigError(f"data file {path} could not be read as Parquet ({type(e).__name__}: {str(e)[:200]}); "
                          "fix the file or leave it out.") from None
    for i, value in enumerate(values):
        text = value_text(value, where=str(path), row=first_row + i, text_field=text_field, flag=FLAG)
        if text is not None:
            yield first_row + i, text


# ---- hf: -------------------------------------------------------------------------------------------------


def hub_rows(name: str, *, text_field: str, split: str) -> Iterator[str]:
    """Every text of a ``datasets.load_dataset(name, split=split, streaming=True)`` stream: no size cap."""
    with _quiet_datasets() as datasets:
        try:
            stream = datasets.load_dataset(name, split=split, streaming=True)
        except Exception as e:
            raise ConfigError(f'could not open hub dataset "{name}" (split "{split}"): {type(e).__name__}: '
                              f"{str(e)[:300]}; check the name, --hf-split and your network access.") from None
        rows = iter(stream)
        row = 0
        while True:
            try:
                record = next(rows)
            except StopIteration:
                return
            except Exception as e:  # a network or format error mid-stream
                raise ConfigError(f'hub dataset "{name}" (split "{split}") stopped after {row:,} rows: '
                                  f"{type(e).__name__}: {str(e)[:300]}; the finished shards are kept, run the same "
                                  "command again to continue.") from None
            text = row_text(record, where=f"hf:{name}", row=row, text_field=text_field, flag=FLAG)
            if text is not None:
                yield text
            row += 1
