"""titan-report on a fault-tolerance run folder, written by hand (no training, no torchft): the groups drawn as one
report, the supervisor's .pid and lock files left out, each failure as one line and two marks on the loss chart.
The same on a real killed-and-rejoined run: tests/test_fault_tolerance.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from titan_core.commands import report as report_cli
from titan_core.fault_tolerance.supervisor import last_logged_step
from titan_core.runtime.ft_events import FT_EVENTS_FILE, append_event


def _metrics(folder: Path, steps: list[int]) -> None:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 10.0 - s / 10}) + "\n" for s in steps))


def ft_folder(root: Path) -> Path:
    """2 groups, 10 steps; replica 1 logged 1-4, died, steps 5-6 were trained by replica 0 alone, it rejoined at 7."""
    run = root / "ft"
    _metrics(run / "replica_0", list(range(1, 11)))
    _metrics(run / "replica_1", [1, 2, 3, 4, 7, 8, 9, 10])
    for name in ("replica_0.pid", "replica_1.pid", "spare.pid", "lighthouse.pid"):
        (run / name).write_text("4242\n")
    (run / ".lock").write_text("")
    (run / "lighthouse.log").write_text("lighthouse says hello\n")
    append_event(run, "start", groups=2, min_replicas=1, max_restarts=3)
    append_event(run, "died", replica=1, how="SIGKILL", restart=1, max_restarts=3, last_logged_step=4)
    append_event(run, "left", replica=1, step=5, how="SIGKILL", live=1, groups=2)
    append_event(run, "rejoined", replica=1, step=7, peer=0, after_s=3.3, live=2, groups=2)
    append_event(run, "end", exit=0)
    return run


FAILURE = ("replica 1 died (SIGKILL) after step 4 (the last step it logged); restart 1 of 3; step 5-6 trained without "
           "it by 1 of 2 groups; rejoined at step 7 from replica 0, 3.3s after its restart")


def _loss_chart(html: str) -> str:
    return re.search(r'<svg class="chart" data-metric="loss".*?</svg>', html, re.S).group(0)  # type: ignore[union-attr]


def test_the_run_folder_itself_is_one_report_with_both_groups_and_the_failure_marked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = ft_folder(tmp_path)
    assert report_cli.main([str(run)]) == 0, capsys.readouterr().err
    html = (run / "report.html").read_text()
    loss = _loss_chart(html)
    assert loss.count("<polyline") == 3  # replica 0 in one piece; replica 1 in two (steps 1-4, 7-10)
    assert '"swatch"' in html and ">replica_0</td>" in html and ">replica_1</td>" in html
    assert re.findall(r'data-kind="(ft-[a-z]+)" data-step="(\d+)"', loss) == [("ft-left", "5"), ("ft-rejoined", "7")]
    assert f'<li class="ft-event">{FAILURE}</li>' in html
    assert ".pid" not in html.split("<h2>Settings</h2>")[0]  # no "run" made of a pid file


def test_the_replica_glob_leaves_out_pid_files_and_still_marks_the_failure(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = ft_folder(tmp_path)
    matched = sorted(run.glob("replica_*"))  # what the shell's RUN/replica_* gives
    assert [p.name for p in matched] == ["replica_0", "replica_0.pid", "replica_1", "replica_1.pid"]
    out = tmp_path / "groups.html"
    assert report_cli.main([*map(str, matched), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"left out {run / 'replica_0.pid'}, {run / 'replica_1.pid'}: process-id or lock files, not run folders" in err
    loss = _loss_chart(out.read_text())
    assert 'data-kind="ft-left" data-step="5"' in loss and 'data-kind="ft-rejoined" data-step="7"' in loss
    assert FAILURE in out.read_text()


def test_only_pid_files_is_one_message_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = ft_folder(tmp_path)
    assert report_cli.main([str(run / "replica_0.pid"), "--out", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert "no run folder among" in err and "Traceback" not in err
    assert not (tmp_path / "x.html").exists()


def test_a_death_without_rejoin_a_cut_record_and_moved_aside_steps_are_told_as_they_are(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = ft_folder(tmp_path)
    append_event(run, "start", groups=2, min_replicas=1, max_restarts=3)
    append_event(run, "died", replica=0, how="exit 1", restart=1, max_restarts=3, last_logged_step=10)
    with (run / FT_EVENTS_FILE).open("a") as f:
        f.write('{"event": "left", "repl')  # the supervisor killed mid-line
    # a plain resume in replica 0's folder moved records aside: said as what they are, not as redone by anyone
    (run / "replica_0" / "metrics.superseded.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 1.0, "superseded_by_run_from_step": 8}) + "\n" for s in (9, 10)))
    assert report_cli.main([str(run)]) == 0
    html = (run / "report.html").read_text()
    assert ("replica 0 died (exit 1) after step 10 (the last step it logged); restart 1 of 3; no rejoin recorded "
            "(the run ended or the supervisor stopped first)") in html
    assert f"1 unreadable line(s) of {FT_EVENTS_FILE} skipped" in html
    assert ("2 records of steps 9-10 moved to metrics.superseded.jsonl when the run in this folder started again "
            "from step 8 (not drawn)") in html


def test_a_group_back_before_any_step_without_it_is_told_so(tmp_path: Path) -> None:
    # The supervisor notes the leave at the rejoin step when the others committed no step without the group.
    run = tmp_path / "ft"
    _metrics(run / "replica_0", list(range(1, 11)))
    _metrics(run / "replica_1", list(range(1, 11)))
    append_event(run, "start", groups=2, min_replicas=1, max_restarts=3)
    append_event(run, "died", replica=1, how="SIGKILL", restart=1, max_restarts=3, last_logged_step=6)
    append_event(run, "left", replica=1, step=7, how="SIGKILL", live=1, groups=2)
    append_event(run, "rejoined", replica=1, step=7, peer=0, after_s=2.0, live=2, groups=2)
    assert report_cli.main([str(run)]) == 0
    html = (run / "report.html").read_text()
    assert ("replica 1 died (SIGKILL) after step 6 (the last step it logged); restart 1 of 3; no step was trained "
            "without it; rejoined at step 7 from replica 0, 2.0s after its restart") in html
    assert "<title>step 7: replica 1 gone (SIGKILL); back before a step was trained without it</title>" in html


def test_a_run_folder_whose_groups_logged_nothing_yet_is_one_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "ft"
    (run / "replica_0").mkdir(parents=True)
    (run / "replica_0.pid").write_text("4242\n")
    append_event(run, "start", groups=1, min_replicas=1, max_restarts=3)
    assert report_cli.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{run} is a fault-tolerance run folder, but none of its replica groups has logged a step yet" in err
    assert "Traceback" not in err and not (run / "report.html").exists()


def test_a_folder_without_the_supervisor_record_says_so(tmp_path: Path) -> None:
    run = ft_folder(tmp_path)
    (run / FT_EVENTS_FILE).unlink()
    assert report_cli.main([str(run)]) == 0
    html = (run / "report.html").read_text()
    assert f"no {FT_EVENTS_FILE} records" in html and 'data-kind="ft-' not in html
    assert _loss_chart(html).count("<polyline") == 2  # nothing guessed from the gap in replica 1's steps


def test_the_supervisor_reads_a_groups_last_step_past_a_half_written_line(tmp_path: Path) -> None:
    _metrics(tmp_path / "g", [1, 2, 3])
    with (tmp_path / "g" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "lo')
    assert last_logged_step(tmp_path / "g") == 3
    assert last_logged_step(tmp_path / "missing") is None


def test_the_png_breaks_a_groups_line_where_it_was_away(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    drawn: dict[str, list[float]] = {}
    plot = Axes.plot

    def recording(self: Axes, xs: list[float], ys: list[float], *args: object, **kwargs: object) -> object:
        drawn[str(kwargs["label"])] = list(xs)
        return plot(self, xs, ys, *args, **kwargs)

    monkeypatch.setattr(Axes, "plot", recording)
    run = ft_folder(tmp_path)
    assert report_cli.main([str(run)]) == 0, capsys.readouterr().err
    assert (run / "report-loss.png").stat().st_size > 1000
    assert drawn["replica_0"] == [float(s) for s in range(1, 11)]  # never away: one line
    one = drawn["replica_1"]  # away after step 4, back at 7: a NaN between, which matplotlib does not join across
    assert one[:4] == [1.0, 2.0, 3.0, 4.0] and one[4] != one[4] and one[5:] == [7.0, 8.0, 9.0, 10.0], one
