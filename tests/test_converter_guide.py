"""docs/writing-a-converter.md must stay true: its config excerpt is the example's code, its
unit-test file passes, and the error and table it shows are what the CLI prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO

GUIDE = REPO / "docs" / "writing-a-converter.md"
EXAMPLE_SRC = REPO / "examples" / "titan-int8-fake" / "src"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", GUIDE.read_text(), flags=re.S)


def console_block_starting(command: str) -> list[str]:
    (block,) = [b for b in blocks("console") if b.startswith(f"$ {command}")]
    return block.splitlines()[1:]


def test_the_config_excerpt_is_the_example_code() -> None:
    (config_block,) = [b for b in blocks("python") if b.startswith("class Int8FakeConfig(BaseModel):")]
    assert config_block in (EXAMPLE_SRC / "titan_int8_fake" / "config.py").read_text()


def test_the_converter_excerpt_is_the_example_code() -> None:
    (converter_block,) = [b for b in blocks("python") if b.startswith("class Int8FakeConverter(")]
    assert converter_block.startswith("class Int8FakeConverter(ModelConverter[Int8FakeConfig]):")
    assert converter_block in (EXAMPLE_SRC / "titan_int8_fake" / "converter.py").read_text()


def test_the_guide_unit_test_file_passes(tmp_path: Path) -> None:
    (test_file,) = [b for b in blocks("python") if b.startswith('"""The converter\'s selection and numbers')]
    (tmp_path / "test_my_converter.py").write_text(test_file)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE_SRC), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_the_shown_typo_error_and_overlap_table_are_what_the_cli_prints(tmp_path: Path) -> None:
    # the example registered under its entry-point name, as an installed wheel would provide it
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from titan_core import register_model_converter\n"
        "from titan_int8_fake import Int8FakeConverter\n"
        "register_model_converter('int8fake', Int8FakeConverter)\n"
        "from titan_core.commands.titan_train import main\n"
        "raise SystemExit(main(sys.argv[2:]))\n"
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code, str(EXAMPLE_SRC), *args], capture_output=True,
                              text=True, cwd=tmp_path, timeout=300)

    typo = cli("--converters", "int8fake", "--int8fake.bitz=4", "--dry-run")
    assert typo.returncode == 2
    expected = console_block_starting("PYTHONPATH=tmp/site titan-train --spec llama3 --converters int8fake --int8fake.bitz=4")
    assert (typo.stdout + typo.stderr).splitlines() == expected

    overlap = cli("--converters", "float8,int8fake", "--int8fake.fqns=feed_forward", "--dry-run",
                  "--llama3.n_layers=2", "--training.seq_len=64", "--training.local_batch_size=4")
    assert overlap.returncode == 0, overlap.stderr
    expected = console_block_starting("PYTHONPATH=tmp/site titan-train --spec llama3 --converters float8,int8fake")
    assert overlap.stdout.splitlines() == expected
