"""``runmgr logbook plot``: what the pictures draw (figure_data), the PNG and the
offline HTML, on a small logbook written with the real Logbook API."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from logbook import Logbook, LogbookError
from logbook import cli
from logbook.plot import figure_data, figures_data, write_html, write_png
from logbook.plot_style import FADED_ALPHA, subrun_colours
from runmgr.cli import main

BATCH = 8
EVIL = '</script><script>alert("run")</script><img src=x onerror=alert(1)>'


def rows(first: int, last: int, loss: float, skip_from: int | None = None) -> list[dict]:
    """Steps first..last at a flat loss; from ``skip_from`` on the stream is BATCH*4 samples further on."""
    return [{"step": s, "loss": loss, "grad_norm": 0.5, "lr": 1e-3, "loss_scale": 2.0 ** 16, "step_time": 0.1,
             "consumed_samples": BATCH * s + (4 * BATCH if skip_from is not None and s >= skip_from else 0)}
            for s in range(first, last + 1)]


@pytest.fixture
def run_dir(tmp_path: Path, clock) -> Path:
    """3.00 trains 1-40 and spikes at 35 (samples [240, 272) are steps 31-34); 3.01 rolls back to 20,
    skips those samples and loses a worker at 60 (no step); 3.02 resumes at 60 and finishes at 80."""
    run_dir = tmp_path / "runs" / "plotme"
    config = {"run": {"name": "plotme", "number": 3}}
    with Logbook.open(run_dir, clock=clock) as book:
        book.start_subrun("3.00", "launch", {}, None, 0, {"skip_ranges": []}, config)
        book.record_metrics("3.00", rows(1, 40, 2.0))
        spike = book.record_incident("3.00", "loss_spike", "loss spike " + EVIL, {}, step=35)
        book.end_subrun("3.00", "restarting", 40, "loss spike")
        clock.advance(5)
        book.start_subrun("3.01", "loss spike", {"incident": spike}, None, 20, {"skip_ranges": [[240, 272]]}, config)
        book.record_metrics("3.01", rows(21, 60, 1.0, skip_from=31))
        book.record_incident("3.01", "worker_death", "rank 1 died", {}, step=None)
        book.end_subrun("3.01", "restarting", 60, "worker lost")
        clock.advance(5)
        book.start_subrun("3.02", "worker lost", {}, None, 60, {"skip_ranges": [[240, 272]]}, config)
        book.record_metrics("3.02", rows(61, 80, 1.0, skip_from=0))
        book.end_subrun("3.02", "finished", 80, None)
    return run_dir


def test_figure_data_fades_the_steps_the_rollback_threw_away(run_dir):
    with Logbook.open(run_dir, create=False) as book:
        data = figure_data(book, "loss")
    pieces = [(s["subrun"], s["kept"], s["steps"][0], s["steps"][-1]) for s in data["segments"]]
    assert pieces == [("3.00", True, 1, 20), ("3.00", False, 21, 40), ("3.01", True, 21, 60), ("3.02", True, 61, 80)]
    assert data["subruns"] == ["3.00", "3.01", "3.02"]
    assert data["axis_label"] == "loss (nats/token)" and not data["log_y"]
    assert "plotme" in data["title"]


def test_figure_data_marks_incidents_and_shades_skipped_windows(run_dir):
    with Logbook.open(run_dir, create=False) as book:
        scale = figure_data(book, "loss_scale")
    # The incident without a step sits where its sub-run stopped.
    assert [(m["step"], m["kind"], m["subrun"]) for m in scale["incidents"]] == [
        (35, "loss_spike", "3.00"), (60, "worker_death", "3.01")]
    assert scale["incidents"][0]["label"] == "loss spike " + EVIL
    # Samples [240, 272) were read by 3.00's steps 31-34 (batch 8); the range carried into 3.02 is shown once.
    assert scale["skip_windows"] == [{"first_step": 31, "last_step": 34, "first_x": 31.0, "last_x": 34.0,
                                      "samples": [240, 272], "subrun": "3.01"}]
    assert scale["log_y"]


def test_png_is_drawn_at_its_size_with_kept_steps_solid_and_thrown_away_steps_faded(run_dir, tmp_path):
    from matplotlib.image import imread

    from logbook.plot_png import build_figure, png_size

    with Logbook.open(run_dir, create=False) as book:
        path = write_png(book, ["loss", "grad_norm"], tmp_path / "out" / "curves.png")
        figures = figures_data(book, ["loss", "grad_norm"])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(path)
    assert (pixels.shape[1], pixels.shape[0]) == png_size(2, lanes=1)  # two incidents far apart: one lane
    # Where the loss panel draws 3.00's line at 2.0: kept at step 10, thrown away at step 25.
    ax = next(ax for ax in build_figure(figures).axes if ax.get_ylabel().startswith("loss"))
    blue = np.asarray(_rgb(subrun_colours(["3.00"])["3.00"]))
    kept, faded = (_strongest(pixels, ax, step, 2.0) for step in (10, 25))
    assert np.abs(kept - blue).max() < 0.1, kept
    expected_faded = FADED_ALPHA * blue + (1 - FADED_ALPHA) * 1.0  # over a white background
    assert np.abs(faded - expected_faded).max() < 0.15 and np.abs(faded - blue).max() > 0.3, faded


def _rgb(hex_colour: str) -> tuple[float, float, float]:
    return tuple(int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))


def _strongest(pixels: np.ndarray, ax, step: float, value: float) -> np.ndarray:
    """The most saturated pixel within 3 px above or below the data point (step, value)."""
    x, y = ax.transData.transform((step, value))
    column, row = int(round(x)), int(round(pixels.shape[0] - y))
    window = pixels[row - 3:row + 4, column, :3]
    return window[np.argmax(window.max(axis=1) - window.min(axis=1))]


def test_html_is_self_contained_and_shows_the_run_strings_as_text(run_dir, tmp_path):
    with Logbook.open(run_dir, create=False) as book:
        path = write_html(book, ["loss", "loss_scale"], tmp_path / "curves.html")
    page = path.read_text(encoding="utf-8")
    assert "Bokeh" in page and "worker_death" in page
    assert not re.search(r"<script[^>]*\bsrc\s*=", page), "every script is inline"
    assert not re.search(r"<link[^>]*\bhref\s*=", page), "every style is inline"
    # Text models, not strings bokeh would read as TeX (and fetch MathJax from a CDN for).
    assert '"name":"PlainText"' in page
    assert "alert(" in page and EVIL not in page and "<img src=x" not in page


def test_cli_writes_the_default_png_and_the_html(run_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["logbook", "plot", str(run_dir), "--metric", "loss,lr", "--html", "page.html"]) == 0
    written = capsys.readouterr().out.split()
    assert written == [str(run_dir / "plots" / "loss-lr.png"), "page.html"]
    assert all(Path(p).is_file() for p in written)


@pytest.mark.parametrize("argv, says", [
    (["--metric", "loss,perplexity"], "unknown metric 'perplexity'"),
    (["--metric", "loss,loss"], "names a metric twice"),
    (["--out", "curves.svg"], "must end in .png"),
    (["--html", "page.htm"], "must end in .html"),
    (["--x", "bogus"], "--x 'bogus' is not an x axis: choose step, tokens or wall"),
    (["--x", "tokens"], "records no tokens per step"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(run_dir, tmp_path, capsys, monkeypatch, argv, says):
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert main(["logbook", "plot", str(run_dir), *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err
    assert sorted(tmp_path.rglob("*")) == before


def test_plot_flags_on_another_action_are_refused(run_dir, capsys):
    with pytest.raises(SystemExit) as stop:  # argparse's refusal: it exits from inside
        main(["logbook", "show", str(run_dir), "--metric", "loss"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("runmgr logbook show: error: unrecognized arguments: --metric loss")
    assert "--metric is for `runmgr logbook plot`" in err


def test_a_run_with_no_sub_runs_is_refused(tmp_path, clock):
    Logbook.open(tmp_path / "empty", clock=clock).close()
    with pytest.raises(LogbookError, match="no sub-runs yet"):
        cli.plot(tmp_path / "empty", "loss", None)
