"""What a plugin author writing from the docs alone ran into (a GPT-2-style spec and an int4 converter,
built as wheels outside the repository): each test here failed before its fix."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def test_conformance_classes_raise_no_pytest_deprecation(tmp_path: Path) -> None:
    """The scaffold's tests/test_conformance.py subclasses TrainSpecConformance / ConverterConformance. Their
    class-scoped fixture was an instance method, which pytest 9 deprecates (PytestRemovedIn10Warning): a plugin
    suite with warnings as errors (`filterwarnings = ["error"]`, common in CI) errored in every check."""
    (tmp_path / "test_kit.py").write_text(textwrap.dedent('''
        from titan_core.testing import ConverterConformance, TrainSpecConformance

        class TestConverter(ConverterConformance):
            converter = "float8"

        class TestSpec(TrainSpecConformance):
            train_spec = "llama3"
    '''))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error::pytest.PytestWarning",
                           "-k", "test_imports", "test_kit.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout, proc.stdout[-2000:]
