"""``titan-plugin new converter|spec NAME --dir DIR``: write a plugin package that installs and
passes the checks.

May import ``plugin``, ``models``, ``config``, ``runtime`` and the leaves.
"""

from __future__ import annotations

import keyword
import os
import re
import shutil
import tempfile
from pathlib import Path
from string import Template

from ..errors import ConfigError
from ..plugin.discovery import CONVERTERS, SPECS, discover
from ..plugin.section_names import refuse_core_section_name
from . import converter_files, spec_files

__all__ = ["write_package"]


# The name is part of folder and file names (titan_NAME/NAME_converter.py) and of a distribution name;
# beyond this a path component can exceed the filesystem's 255 bytes.
MAX_NAME = 64


def _names(name: str, kind: str) -> dict[str, str]:
    if len(name) > MAX_NAME:
        raise ConfigError(f'a {kind} name of {len(name)} characters is too long: at most {MAX_NAME} (it becomes part '
                          f"of file, folder and package names). Choose a shorter name.")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise ConfigError(
            f'"{name}" cannot name a {kind}: use lower-case letters, digits and "_", starting with a letter '
            f'(it becomes the entry-point name, the config section [{name}] and part of the package name).'
        )

    refuse_core_section_name(name, who=f'the new {kind}', fix="Choose another name.")
    _refuse_installed_name(name, kind)
    cls = "".join(part.capitalize() for part in name.split("_"))
    return {"name": name, "Cls": cls, "cls": f"{cls}Converter", "pkg": f"titan_{name}", "dist": f"titan-{name.replace('_', '-')}"}


def _refuse_installed_name(name: str, kind: str) -> None:
    """An installed plugin (of either kind: the name is also the config section) already answers to ``name``:
    once the new package is installed too, two distributions would claim it and neither would load."""
    for group, what in ((SPECS, "spec"), (CONVERTERS, "converter")):
        claims = discover(group).get(name, [])
        if claims:
            owners = ", ".join(f"{c.distribution} {c.version}" for c in claims)
            raise ConfigError(
                f'a {what} named "{name}" is already installed ({owners}); a new {kind} of that name would clash with '
                f"it (both would claim the entry point and the config section [{name}]). Choose another name, e.g. "
                f'"my_{name}".')


def write_package(kind: str, name: str, directory: str | Path) -> Path:
    """Write the package for a new ``kind`` ("converter" or "spec") called ``name`` into ``directory``."""

    values = _names(name, kind)
    root = Path(directory)
    if root.is_symlink() and not root.exists():
        raise ConfigError(f"--dir {root} is a symbolic link to {os.readlink(root)}, which does not exist; remove the "
                          f"link or choose a new folder.")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ConfigError(f"--dir {root} already exists and is not an empty folder; choose a new folder.")
    files = (converter_files if kind == "converter" else spec_files).FILES
    # Written beside --dir, then renamed into place: a failure half-way (a full disk, a path too long) leaves
    # nothing behind, and --dir is either the whole package or as it was.
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name[:40]}.", dir=root.parent))
    try:
        for rel, text in files.items():
            path = staging / Template(rel).substitute(values)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(Template(text).substitute(values))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's folder is private; the package is an ordinary folder
        os.replace(staging, root)  # onto a missing or empty folder
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return root
