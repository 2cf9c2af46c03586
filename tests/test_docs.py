"""Docs that describe code stay true: generated reference, and every repo path they name exists."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO


def test_configuration_reference_is_current() -> None:
    text = (REPO / "docs/configuration.md").read_text()
    embedded = text.split("<!-- BEGIN REFERENCE -->\n", 1)[1].split("<!-- END REFERENCE -->", 1)[0]
    fresh = subprocess.run([sys.executable, str(REPO / "scripts/gen_config_reference.py")],
                           capture_output=True, text=True, check=True).stdout
    assert embedded == fresh, "docs/configuration.md is stale: regenerate with scripts/gen_config_reference.py"


def test_paths_named_in_docs_exist() -> None:
    pattern = re.compile(r"`((?:src|plugins|examples|tests|benchmarks|scripts|docs)/[A-Za-z0-9_./-]+)`")
    missing = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for path in pattern.findall(doc.read_text()):
            if not (REPO / path.rstrip(".")).exists():
                missing.append(f"{doc.name}: {path}")
    assert not missing, missing
