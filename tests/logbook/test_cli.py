import io
import json
import math

import pytest

from logbook import LOGBOOK_FILENAME, Logbook, LogbookError
from logbook import cli


def test_metrics_jsonl_round_trips_floats_exactly(scripted_run):
    out = io.StringIO()
    assert cli.metrics_jsonl(scripted_run.run_dir, out) == 0
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 201))
    for row in rows:
        recorded = scripted_run.recorded[(row["subrun"], row["step"])]
        for name in ("loss", "grad_norm", "lr", "loss_scale", "step_time", "time"):
            assert row[name] == recorded[name], (name, row["step"])
        assert row["tokens_per_s"] == recorded["tokens"] / recorded["step_time"]


def test_metrics_jsonl_all_includes_the_lost_steps(scripted_run):
    out = io.StringIO()
    cli.metrics_jsonl(scripted_run.run_dir, out, kept=False)
    assert len(out.getvalue().splitlines()) == len(scripted_run.recorded)


def test_nan_and_negative_zero_survive_jsonl(tmp_path, clock):
    with Logbook.open(tmp_path, clock=clock) as book:
        book.start_subrun("1.00", "launch", {}, None, 0, {}, {})
        book.record_metrics("1.00", [{"step": 1, "loss": math.nan, "grad_norm": -0.0, "lr": 0.1 + 0.2}])
    out = io.StringIO()
    cli.metrics_jsonl(tmp_path, out)
    row = json.loads(out.getvalue())
    assert math.isnan(row["loss"]) and math.copysign(1.0, row["grad_norm"]) == -1.0
    assert row["lr"] == 0.1 + 0.2


def test_events_jsonl_lines_parse_in_order(scripted_run):
    out = io.StringIO()
    assert cli.events_jsonl(scripted_run.run_dir, out) == 0
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert events[0]["type"] == "subrun_start" and events[-1]["type"] == "subrun_end"
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    incident = next(e for e in events if e["type"] == "incident")
    assert incident["evidence"]["pid"] == 4242 and incident["ranks"] == [1]


def test_show_prints_the_chronicle(scripted_run):
    out = io.StringIO()
    assert cli.show(scripted_run.run_dir, out) == 0
    text = out.getvalue()
    assert text.startswith("run 7") and "finished at step 200" in text


def test_a_missing_run_is_one_clear_line_and_creates_nothing(tmp_path):
    missing = tmp_path / "runs" / "foo"
    for command in (cli.show, cli.events_jsonl, cli.metrics_jsonl):
        with pytest.raises(LogbookError) as error:
            command(missing, io.StringIO())
        message = str(error.value)
        assert message == (f"no logbook at {missing}: run `runmgr launch conf=... run.name=foo` first, "
                           "or pass a run directory")
    assert not missing.exists()


def test_list_runs_has_one_line_per_run(scripted_run, tmp_path, clock):
    runs_root = scripted_run.run_dir.parent
    with Logbook.open(runs_root / "alpha", clock=clock) as book:
        book.start_subrun("1.00", "launch", {}, None, 0, {}, {})
        book.record_metrics("1.00", [{"step": 1}, {"step": 2}])
    (runs_root / "not-a-run").mkdir()
    out = io.StringIO()
    assert cli.list_runs(runs_root, out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].split() == ["alpha", "running", "1", "sub-runs", "step", "2", "ETTR", "-", "last:", "no",
                                "incident"]
    assert lines[1].split()[:7] == ["seven", "finished", "3", "sub-runs", "step", "200", "ETTR"]
    assert lines[1].endswith("last: loss 9.1 at step 118, 3.4x the running median")
    assert not (runs_root / "not-a-run" / LOGBOOK_FILENAME).exists()


def test_list_runs_without_a_runs_folder_says_what_to_do(tmp_path):
    with pytest.raises(LogbookError, match="launch a run first"):
        cli.list_runs(tmp_path / "nowhere", io.StringIO())


def test_show_titles_by_name_and_keeps_evidence_for_events(controller_run):
    out = io.StringIO()
    cli.show(controller_run.run_dir, out)
    assert out.getvalue().startswith("demo — run 1\n") and str(controller_run.run_dir) not in out.getvalue()
    events = io.StringIO()
    cli.events_jsonl(controller_run.run_dir, events)
    starts = [json.loads(line) for line in events.getvalue().splitlines() if '"subrun_start"' in line]
    assert starts[1]["evidence"]["incident"]["evidence"]["exit_code"] == -9  # the detail lives here
    assert starts[1]["evidence"]["rejected_checkpoints"][0][0].startswith(str(controller_run.run_dir))


def test_list_json_is_one_object_per_run(scripted_run, controller_run):
    out = io.StringIO()
    assert cli.list_runs(scripted_run.run_dir.parent, out, as_json=True) == 0
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(line["name"], line["state"], line["subruns"], line["last_step"]) for line in lines] == [
        ("demo", "failed", 3, 36), ("seven", "finished", 3, 200)]
    assert lines[0]["last_incident"].startswith("loss_spike at step 30")
    assert 0 < lines[1]["ettr"] < 1


def test_show_json_is_the_run_report(scripted_run):
    out = io.StringIO()
    assert cli.show(scripted_run.run_dir, out, as_json=True) == 0
    report = json.loads(out.getvalue())
    assert report["name"] == "seven" and report["state"] == "finished"
    assert {cost["kind"]: cost["steps_lost"] for cost in report["costs"]} == {"worker_lost": 7, "loss_spike": 20}
    assert report["summary"]["steps_kept"] == 200 and len(report["ettr_series"]) == 3


def test_show_tells_the_cost_of_each_incident_class(scripted_run):
    out = io.StringIO()
    cli.show(scripted_run.run_dir, out)
    text = out.getvalue()
    header = text.split("\n\n")[0]
    assert "cost by incident class" in header and "MTBI" in header and "ETTR at each sub-run's end" in header
    spike = next(line for line in header.splitlines() if line.strip().startswith("loss_spike"))
    assert spike.split()[:6] == ["loss_spike", "1", "1", "ended", "20", "steps"]
    assert "trained steps 61–120 (60 recorded)" in text  # the chronicle reads first and last rows only


def test_a_copied_run_directory_answers_every_view_as_the_original(scripted_run, tmp_path):
    """A run directory is self-contained: moved to another machine (here: copied, the original
    deleted), show, list, plot and export answer the same from the copy."""
    import shutil

    from logbook.markdown import export_markdown
    from logbook.plot import write_png

    def views(run_dir):
        shown, listed, as_json = io.StringIO(), io.StringIO(), io.StringIO()
        cli.show(run_dir, shown)
        cli.show(run_dir, as_json, as_json=True)
        cli.list_runs(run_dir.parent, listed)
        with Logbook.open(run_dir, create=False) as book:
            png = write_png(book, ["loss", "lr"], run_dir / "plots" / "loss.png").read_bytes()
            markdown = export_markdown(book, run_dir / "notes.md").read_text(encoding="utf-8")
        report = json.loads(as_json.getvalue())
        report.pop("run_dir")
        return shown.getvalue(), listed.getvalue(), report, png[:8], markdown

    original = views(scripted_run.run_dir)
    copy = tmp_path / "elsewhere" / scripted_run.run_dir.name
    shutil.copytree(scripted_run.run_dir, copy)
    shutil.rmtree(scripted_run.run_dir)
    copied = views(copy)
    assert copied == original and str(scripted_run.run_dir) not in "".join(copied[:2] + copied[4:])
