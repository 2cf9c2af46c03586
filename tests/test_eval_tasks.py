"""Eval task files (docs/evaluation.md): each bad line refused with its file:line and the fix, the built-in
tasks, and the [eval] layouts refused. Unit-level: the fast tier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from titan_core.errors import ConfigError
from titan_core.evaluation import load_tasks
from titan_core.evaluation.tasks import BUILTIN_TASKS

MC = {"context": "2 + 2 =", "choices": [" 4", " 5"], "gold": 0}
BAD_LINES = [
    ('{"context": "a", "choices": [" b", " c"]}', "missing field 'gold'"),
    ('{"context": "a", "choices": [" b", " c"], "gold": 2}', "'gold' is 2, but it must be the index of the right choice, a whole number from 0 to 1"),
    ('{"context": "a", "choices": [], "gold": 0}', "'choices' has 0 entries; give at least two"),
    ('{"context": "a", "choices": [" b", ""], "gold": 0}', "choice 1 is the empty string"),
    ('{"context": "a", "choices": [" b", " c"], "gold": true}', "'gold' is true"),
    ("not json", "not JSON"),
    ('["a"]', "a JSON list, not an object"),
    ('{"text": ""}', "'text' must be a non-empty string"),
    ('{"text": "doc"}', "a perplexity line in a multiple-choice task"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES, ids=[m.split(",")[0][:30] for _, m in BAD_LINES])
def test_a_bad_task_line_is_refused_with_its_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    task = tmp_path / "task.jsonl"
    first = {"text": "a document"} if line.startswith('{"text"') and "non-empty" in message else MC
    task.write_text(json.dumps(first) + "\n\n" + line + "\n")
    with pytest.raises(ConfigError) as caught:
        load_tasks([str(task)])
    assert f"{task}:3: " in str(caught.value) and message in str(caught.value), str(caught.value)


def test_task_names_and_kinds(tmp_path: Path) -> None:
    tasks = load_tasks(["builtin"])
    assert [(t.name, t.kind) for t in tasks] == [("python_syntax", "multiple_choice"), ("python_text", "perplexity")]
    assert [t.name for t in load_tasks(["builtin:python_text"])] == ["python_text"]
    with pytest.raises(ConfigError, match="names no built-in task; the built-in tasks are builtin:python_syntax"):
        load_tasks(["builtin:nope"])
    with pytest.raises(ConfigError, match="two tasks are named 'python_text'"):
        load_tasks(["builtin", str(BUILTIN_TASKS["python_text"])])
    with pytest.raises(ConfigError, match="does not exist; give a JSONL file"):
        load_tasks([str(tmp_path / "missing.jsonl")])
