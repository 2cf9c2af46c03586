"""Modules that moved into packages keep their old import paths for plugins written against API 1.0
(src/titan_core/_moved.py): the old name gives the moved module itself, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from titan_core import _moved

# every old path a plugin could have used: each moved top-level module
OLD_PATHS = sorted(_moved.MOVED)


@pytest.mark.parametrize("old", OLD_PATHS)
def test_the_old_path_imports_the_moved_module_itself(old: str) -> None:
    new = f"titan_core.{_moved.MOVED[old]}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sys.modules.pop(f"titan_core.{old}", None)
        aliased = importlib.import_module(f"titan_core.{old}")
    assert aliased is importlib.import_module(new)
    assert aliased.__spec__ is not None and aliased.__spec__.name == new  # the module keeps its own identity
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught), caught


def test_a_from_import_of_an_old_path_works_in_a_fresh_process() -> None:
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n    from titan_core.model_parts import FeedForward\nexcept DeprecationWarning as e:\n"
            "    print('warned:', e)\n"
            "warnings.simplefilter('ignore')\n"
            "from titan_core.model_parts import FeedForward\nfrom titan_core.models.model_parts import FeedForward as F\n"
            "print(FeedForward is F)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "warned: titan_core.model_parts moved to titan_core.models.model_parts" in out.stdout
    assert out.stdout.rstrip().endswith("True")


def test_a_name_that_never_existed_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("titan_core.no_such_module")
    assert _moved.new_name("titan_core.report.page") == "titan_core.observability.report.page"
    assert _moved.new_name("titan_core.checkpoint.manager") is None
