"""``titan-plugin new converter|spec NAME --dir DIR``: write a plugin package that installs and
passes the checks.

May import ``plugin``, ``models``, ``config``, ``runtime`` and the leaves.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from string import Template

from ..errors import ConfigError
from ..plugin.section_names import refuse_core_section_name
from . import converter_files, spec_files

__all__ = ["write_package"]


def _names(name: str, kind: str) -> dict[str, str]:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise ConfigError(
            f'"{name}" cannot name a {kind}: use lower-case letters, digits and "_", starting with a letter '
            f'(it becomes the entry-point name, the config section [{name}] and part of the package name).'
        )

    refuse_core_section_name(name, who=f'the new {kind}', fix="Choose another name.")
    cls = "".join(part.capitalize() for part in name.split("_"))
    return {"name": name, "Cls": cls, "cls": f"{cls}Converter", "pkg": f"titan_{name}", "dist": f"titan-{name.replace('_', '-')}"}


def write_package(kind: str, name: str, directory: str | Path) -> Path:
    """Write the package for a new ``kind`` ("converter" or "spec") called ``name`` into ``directory``."""

    values = _names(name, kind)
    root = Path(directory)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ConfigError(f"--dir {root} already exists and is not an empty folder; choose a new folder.")
    files = (converter_files if kind == "converter" else spec_files).FILES
    for rel, text in files.items():
        path = root / Template(rel).substitute(values)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(text).substitute(values))
    return root
