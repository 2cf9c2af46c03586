"""Write a folder of outputs beside its final place, then publish it whole, keeping files the user added.

Used by the Hugging Face export (``checkpoint.export_format=hf`` and ``titan-convert to-hf``)
and by ``titan-convert from-hf``:

* ``fresh_partial(final)`` makes ``.<name>.partial`` next to ``final`` with a mark file
  inside. A partial folder left by an interrupted run (it has the mark) is removed and
  started again; a folder of that name without the mark is someone else's and is refused,
  never deleted.
* ``publish(partial, final)`` lists the files written in ``.titan-files.json`` and puts the
  folder in place. A new ``final`` is one ``rename``. An existing ``final`` (a resumed run
  exporting again) is swapped whole: every entry the previous export did not write (listed
  in its ``.titan-files.json``: a user's evaluation results, notes, subfolders) is
  hard-linked (copied where links are impossible) into the new folder first, then
  ``final`` is renamed to ``.<name>.previous``, the new folder to ``final``, and the
  previous one removed. Nothing the previous export did not write is ever deleted, and an
  interruption at any point leaves either the old folder, or the new one, or (between the two
  renames) the old one at ``.<name>.previous``, which the next publish takes as the old folder.

So an interrupted export or conversion never leaves a ``final`` that looks complete but is not.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from ..errors import ConfigError

__all__ = ["FILES_LIST", "PARTIAL_MARK", "discard_partial", "fresh_partial", "publish"]

PARTIAL_MARK = ".titan-partial"
FILES_LIST = ".titan-files.json"
# What an export wrote before FILES_LIST existed: recognised by name (nothing else is taken for ours).
_LEGACY_OURS = re.compile(r"^(config\.json|generation_config\.json|tokenizer\.json|tokenizer_config\.json|"
                          r"special_tokens_map\.json|original/tokenizer\.model|"
                          r"model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json)$")


def partial_of(final: Path) -> Path:
    return final.parent / f".{final.name}.partial"


def previous_of(final: Path) -> Path:
    return final.parent / f".{final.name}.previous"


def _remove_ours(folder: Path, what: str) -> None:
    """Remove a leftover ``folder`` only when a titan run made it (it carries the mark)."""
    if not folder.exists() and not folder.is_symlink():
        return
    if folder.is_dir() and not folder.is_symlink() and ((folder / PARTIAL_MARK).is_file() or not any(folder.iterdir())):
        shutil.rmtree(folder)
        return
    raise ConfigError(f"{folder} exists but was not made by titan-core (no {PARTIAL_MARK} in it); titan uses that "
                      f"name for the {what}. Move it away (titan never deletes what it did not write).")


def fresh_partial(final: Path) -> Path:
    """An empty ``.<name>.partial`` folder beside ``final``, marked as titan's."""
    final = Path(final)
    partial = partial_of(final)
    _remove_ours(partial, f"unfinished copy of {final}")
    try:
        partial.mkdir(parents=True)
    except OSError as exc:  # name the folder the user asked for, not our hidden work folder beside it
        raise OSError(exc.errno, exc.strerror, str(final)) from None
    (partial / PARTIAL_MARK).write_bytes(b"")
    return partial


def discard_partial(final: Path) -> None:
    """Remove ``final``'s unfinished copy after a failed write (ours only: it carries the mark); never raises."""
    partial = partial_of(Path(final))
    if partial.is_dir() and not partial.is_symlink() and (partial / PARTIAL_MARK).is_file():
        shutil.rmtree(partial, ignore_errors=True)


def _files_below(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if (p.is_file() or p.is_symlink()) and p.name not in (PARTIAL_MARK, FILES_LIST))


def _written_by_titan(folder: Path) -> set[str]:
    try:
        listed = json.loads((folder / FILES_LIST).read_text(encoding="utf-8"))
        if isinstance(listed, list) and all(isinstance(x, str) for x in listed):
            return {*listed, FILES_LIST, PARTIAL_MARK}
    except (OSError, ValueError):
        pass
    return {f for f in _files_below(folder) if _LEGACY_OURS.match(f)} | {FILES_LIST, PARTIAL_MARK}


def _carry_user_entries(old: Path, new: Path) -> None:
    """Hard-link (or copy) into ``new`` every file of ``old`` the previous export did not write."""
    ours = _written_by_titan(old)
    for path in sorted(old.rglob("*")):
        rel = path.relative_to(old).as_posix()
        if rel in ours or path.is_dir() and not path.is_symlink():
            continue
        target = new / rel
        if target.exists() or target.is_symlink():
            continue  # a name the new export writes itself: the export's file
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            os.symlink(os.readlink(path), target)
            continue
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)
    for path in sorted(old.rglob("*")):  # empty folders the user made
        if path.is_dir() and not path.is_symlink():
            (new / path.relative_to(old)).mkdir(parents=True, exist_ok=True)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(partial: Path, final: Path) -> None:
    """Put ``partial`` (made by fresh_partial, fully written) in place as ``final`` (see the module docstring)."""
    final = Path(final)
    (partial / FILES_LIST).write_text(json.dumps(_files_below(partial), indent=1), encoding="utf-8")
    previous = previous_of(final)
    if not final.exists() and previous.is_dir() and (previous / PARTIAL_MARK).is_file():
        old: Path | None = previous  # an earlier publish stopped between its two renames
    elif final.is_dir() and not final.is_symlink():
        old = final
    elif final.exists() or final.is_symlink():
        raise ConfigError(f"{final} exists and is not a folder; move it away or choose another place.")
    else:
        old = None
    if old is not None:
        _carry_user_entries(old, partial)
    if old is final:
        _remove_ours(previous, f"previous copy of {final}")
        final.rename(previous)
        (previous / PARTIAL_MARK).write_bytes(b"")  # now titan's to remove: its user files live on in partial
    partial.rename(final)
    (final / PARTIAL_MARK).unlink()  # after the rename: a partial folder always carries the mark
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(previous, ignore_errors=True)
