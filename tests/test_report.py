"""titan-report: the page a real run writes at its end opens in headless Chromium with no console
error and no request beyond itself, and every chart has each run's line drawn (pixels of the
run's colour in a screenshot of its plot area); bad run folders are one message and exit 2.

The browser test skips only when no Chromium is installed (CI installs it: .ci/run).
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from titan_core.commands import report as report_cli
from titan_core.observability.report import png_path_of, report_at_end, write_report
from titan_core.observability.report.page import CHARTS
from titan_core.observability.report.runs import config_differences, read_run
from titan_core.observability.report.svg import COLORS

from browser import Browser, find_chromium
from conftest import REPO

BIN = Path(sys.executable).parent
# A second run's folder name and setting that would run script or fetch an image if not escaped.
HOSTILE_NAME = "<img src=x onerror=console.error(1)>"
HOSTILE_VALUE = "</pre><script>console.error('ran')</script>"


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A short real run with validation and MFU (a configured peak), so every chart has data."""
    run = tmp_path_factory.mktemp("report") / "run"
    cmd = [str(BIN / "titan-train"), "--spec", "llama3", "--flavor", "debugmodel_gqa", "--llama3.n_layers=1",
           "--training.steps=4", "--training.seq_len=32", "--training.local_batch_size=2", "--metrics.log_freq=1",
           "--validation.enable=true", "--validation.freq=2", "--validation.steps=1", "--metrics.peak_tflops=1",
           f"--job.run_dir={run}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={"OMP_NUM_THREADS": "1", "PATH": f"{BIN}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run, proc.stderr


def test_a_run_writes_its_report_and_loss_png_at_the_end(real_run: tuple[Path, str]) -> None:
    run, err = real_run
    assert f"[titan] report: {run / 'report.html'} and report-loss.png" in err
    page = (run / "report.html").read_text()
    assert page.count('<svg class="chart"') == len(CHARTS)
    assert (run / "report-loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "data:image/png;base64," in page
    # Nothing the page needs lives elsewhere: no address outside itself, no script at all.
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page
    assert "<script" not in page and 'src="data:' in page


def _second_run(first: Path, root: Path) -> Path:
    """A copy of the real run with another learning rate and every metric at 0.8 times its value (so no line
    hides the other), under a hostile folder name."""
    second = root / HOSTILE_NAME
    shutil.copytree(first, second)
    records = [json.loads(line) for line in (second / "metrics.jsonl").read_text().splitlines()]
    lines = [json.dumps({k: v if k == "step" else v * 0.8 for k, v in r.items()}) for r in records]
    (second / "metrics.jsonl").write_text("\n".join(lines) + "\n{half a line")
    config = (second / "config.toml").read_text()
    assert "\nlr = " in config
    (second / "config.toml").write_text(config.replace("\nlr = ", "\nlr = 0.5\nold_lr = ", 1)
                                        + f'\n[notes]\ntext = "{HOSTILE_VALUE}"\n')
    return second


def test_two_runs_overlaid_with_their_differences(real_run: tuple[Path, str], tmp_path: Path) -> None:
    second = _second_run(real_run[0], tmp_path)
    runs = [read_run(real_run[0]), read_run(second)]
    assert runs[1].skipped_lines == 1
    assert runs[1].last("loss") == pytest.approx(runs[0].last("loss") * 0.8)  # type: ignore[operator]
    keys = [key for key, _ in config_differences(runs)]
    assert "optimizer.lr" in keys and "optimizer.old_lr" in keys and "notes.text" in keys
    assert "job.run_dir" not in keys  # differs by nature, not by choice


def _colour_pixels(png: bytes, hex_colour: str) -> int:
    import numpy as np
    from PIL import Image

    target = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)])
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int32)
    return int((np.abs(pixels - target) <= 40).all(axis=-1).sum())


CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium; "
                                                             ".ci/run installs it in CI)")


@needs_chromium
def test_the_page_opens_in_chromium_with_every_chart_drawn(real_run: tuple[Path, str], tmp_path: Path) -> None:
    second = _second_run(real_run[0], tmp_path)
    out = tmp_path / "compare.html"
    assert report_cli.main([str(real_run[0]), str(second), "--out", str(out)]) == 0
    assert CHROMIUM is not None
    browser = Browser(CHROMIUM, tmp_path / "profile")
    try:
        browser.open(out.as_uri())
        charts = browser.evaluate("""JSON.stringify([...document.querySelectorAll('svg.chart')].map(svg => {
            const area = svg.querySelector('.plot-area'), r = area.getBoundingClientRect();
            return {metric: svg.dataset.metric, empty: area.classList.contains('empty'),
                    x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height};
        }))""")
        images = browser.evaluate("[...document.images].map(i => i.complete && i.naturalWidth > 0)")
        differing = browser.evaluate("document.body.innerText")
        (tmp_path / "page.png").write_bytes(browser.screenshot())  # for a person looking at a failure
        shots = {c["metric"]: browser.screenshot({k: c[k] for k in ("x", "y", "width", "height")})
                 for c in json.loads(charts)}
        assert browser.console_errors() == []
        # nothing fetched beyond the page itself and its inline (data:) image
        assert [url for url in browser.requests() if not url.startswith("data:")] == [out.as_uri()]
        charts = json.loads(charts)
    finally:
        browser.close()
    assert [c["metric"] for c in charts] == [chart[0] for chart in CHARTS]
    assert not [c["metric"] for c in charts if c["empty"]]
    assert all(c["width"] > 300 and c["height"] > 150 for c in charts)
    assert images == [True]  # the inline PNG decoded
    for metric, png in shots.items():
        for colour in COLORS[:2]:  # both runs' lines, in each chart
            assert _colour_pixels(png, colour) > 30, f"chart {metric}: no line in {colour}"
    assert HOSTILE_NAME in differing and HOSTILE_VALUE in differing  # shown as text, not run
    assert "optimizer.lr" in differing


@needs_chromium
def test_the_browser_check_sees_console_errors_and_requests(tmp_path: Path) -> None:
    """The harness itself: a page that logs an error and fetches an image is caught on both counts."""
    page = tmp_path / "bad.html"
    page.write_text('<html><body><img src="missing.png"><script>console.error("boom")</script></body></html>')
    assert CHROMIUM is not None
    browser = Browser(CHROMIUM, tmp_path / "profile")
    try:
        browser.open(page.as_uri())
        errors, requests = browser.console_errors(), browser.requests()
    finally:
        browser.close()
    assert any("boom" in e for e in errors) and any("missing.png" in e for e in errors), errors
    assert (tmp_path / "missing.png").as_uri() in requests


def test_without_matplotlib_the_page_is_written_and_the_message_says_how(
        real_run: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("matplotlib", "matplotlib.figure"):  # importing either now raises ImportError
        monkeypatch.setitem(sys.modules, name, None)
    out = tmp_path / "r.html"
    assert report_cli.main([str(real_run[0]), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: matplotlib is not installed, so no PNG of the loss was drawn; install it with pip install " \
           "'titan-core[plot]'" in err
    assert "matplotlib is not installed" in out.read_text() and not png_path_of(out).exists()


def test_a_failure_to_draw_at_the_end_of_training_is_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    (tmp_path / "report.html").mkdir()  # where the page goes: writing it fails
    assert report_at_end(tmp_path) is None
    err = capsys.readouterr().err
    assert f"[titan] warning: the run's report was not written (TitanError: cannot use {tmp_path / 'report.html'}" in err
    assert f"draw it later with titan-report {tmp_path}" in err


@pytest.mark.parametrize(("args", "message"), [
    (["{tmp}/nope"], "nope does not exist; give titan run folders"),
    (["{tmp}"], "has no metrics.jsonl, so it is not a titan run folder"),
    (["{run}", "{run}"], "2 runs are overlaid on one page: name it with --out FILE.html."),
    (["{run}", "--out", "{tmp}/r.png"], "must end in .html"),
])
def test_bad_input_is_one_message_and_exit_2(args: list[str], message: str, real_run: tuple[Path, str],
                                            tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.format(tmp=tmp_path, run=real_run[0]) for a in args]
    assert report_cli.main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("titan-report: error:")]
    assert len(errors) == 1 and message in errors[0], err
    assert "Traceback" not in err


def test_write_report_keeps_the_last_record_of_a_step(tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n{"step": 1, "loss": 4.0}\n[1]\n'
                                       '{"step": 2, "loss": NaN}\n{"step": 3, "loss": 3.0}\n')
    data = read_run(run)
    assert data.series["loss"][0] == (1.0, 4.0) and data.skipped_lines == 1 and data.last("loss") == 3.0
    written = write_report([run], run / "report.html")
    page = written.html.read_text()
    assert "1 non-finite losses (gaps in the lines)" in page
    # A chart with nothing to draw says why instead of showing empty axes.
    assert page.count('class="not-drawn"') == len(CHARTS) - 1 and 'class="plot-area empty"' not in page
    assert "no MFU: the device&#x27;s peak is unknown (set --metrics.peak_tflops)" in page
