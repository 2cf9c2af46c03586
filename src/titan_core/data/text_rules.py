"""The rules a data file's bytes become documents by, shared by the trainer's readers (``sources.py``,
``json_lines.py``) and ``titan-data prepare`` (``doc_stream.py``): one place, so a file is never packed
by one and refused, or read differently, by the other.

* **Byte-order mark**: a UTF-8 BOM (EF BB BF) at the start of a file, or of a line of a JSON-lines file
  (files joined with ``cat``), is an encoding mark written by some editors, not text: it is dropped.
  A U+FEFF anywhere else is a character of the text and kept.
* **Invalid UTF-8**: the file is refused, naming it, the line (JSON lines) and the byte; nothing is
  replaced or skipped silently.
* **Rows**: a row without the text field is refused, naming the file, the row and the fields it has
  (a wrong ``text_field``, or a row of another kind mixed in, is a mistake to fix, not data to drop
  quietly); a row whose text is null or empty is skipped (an empty document); any other value that is
  not a string is refused.
"""

from __future__ import annotations

from ..errors import ConfigError

BOM = b"\xef\xbb\xbf"
TRAINER_FLAG = "--data.text_field"


def without_bom(raw: bytes) -> bytes:
    return raw[len(BOM):] if raw.startswith(BOM) else raw


def decode_utf8(raw: bytes, *, path: object, line: int | None = None) -> str:
    """``raw`` (a whole file, or line ``line`` of a JSON-lines file) as text, its leading BOM dropped;
    ConfigError naming the file, the line and the byte when it is not UTF-8."""
    raw = without_bom(raw)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        at, byte = e.start, raw[e.start]
    if line is None:
        raise ConfigError(f"data file {path} is not UTF-8 text (undecodable byte at offset {at}); "
                          "convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8) or remove it from the source.")
    raise ConfigError(f"data file {path} line {line}: invalid UTF-8 (undecodable byte 0x{byte:02x} at column "
                      f"{at + 1}); JSON text must be UTF-8. Re-encode the file as UTF-8 (e.g. iconv -f latin1 "
                      "-t utf-8), or remove that line.")


def value_text(value: object, *, where: str, row: int, text_field: str, flag: str = TRAINER_FLAG) -> str | None:
    """A row's text value: the text, None for null or empty (skipped), ConfigError for anything else."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f'{where}: row {row} field "{text_field}" holds {type(value).__name__}, not text; '
                          f"set {flag} to a string field, or fix that row.")
    return value


def row_text(record: object, *, where: str, row: int, text_field: str, flag: str = TRAINER_FLAG) -> str | None:
    """The text of one JSON row (an object): see the module's rules."""
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: row {row} is {type(record).__name__}, not an object with a "
                          f'"{text_field}" field; each row is one JSON object, e.g. {{"{text_field}": "..."}}.')
    if text_field not in record:
        raise ConfigError(f'{where}: row {row} has no field "{text_field}" (its fields: {", ".join(record) or "none"}); '
                          f"set {flag} to the field that holds the text, or remove that row (a row with "
                          f'"{text_field}": null is skipped as an empty document).')
    return value_text(record[text_field], where=where, row=row, text_field=text_field, flag=flag)
