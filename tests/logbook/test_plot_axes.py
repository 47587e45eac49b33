"""``runmgr logbook plot`` on a busy run (tests/logbook/busy_run.py): incident labels a
person can read, no loss-scale panel for a run that scales no loss, and the x axis in
steps, tokens trained or wall-clock time."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from logbook import Logbook
from logbook.plot import UNSCALED_NOTE, default_metrics, figures_data
from logbook.plot_png import (LABEL_GAP_PX, MAX_LANES, IncidentLabel, build_figure, incident_labels, place_labels,
                              tokens_text)
from logbook.plot_x import x_axis
from runmgr.cli import main
from tests.logbook.busy_run import FULL_BATCH, SCRIPT, SHRUNK_BATCH, STEP_S, write_busy_run

KINDS = {kind for script in SCRIPT for kind, _, _ in script.incidents}


@pytest.fixture(scope="module")
def busy(tmp_path_factory) -> Path:
    return write_busy_run(tmp_path_factory.mktemp("plot") / "busy")


def drawn_labels(figure) -> list:
    """The incident labels of a drawn figure, with the renderer that drew them."""
    figure.canvas.draw()
    return [text for ax in figure.axes for text in ax.texts if text.get_gid() == "incident-label"]


def disjoint(a, b, gap: float = 0.0) -> bool:
    return a.x1 + gap <= b.x0 or b.x1 + gap <= a.x0 or a.y1 + gap <= b.y0 or b.y1 + gap <= a.y0


def test_incident_labels_are_horizontal_readable_and_never_overlap(busy):
    with Logbook.open(busy, create=False) as book:
        figure = build_figure(figures_data(book, ("loss",)))
    labels = drawn_labels(figure)
    texts = [label.get_text() for label in labels]
    # The picture: two loss spikes and two grad spikes at steps 600 and 604, one label over the other.
    assert "loss_spike ×2" in texts and "grad_spike ×2" in texts
    assert {text.split(" ×")[0] for text in texts} == KINDS, "every kind of the run is named on the picture"
    assert all(label.get_rotation() == 0 and label.get_fontsize() >= 8 for label in labels)
    renderer = figure.canvas.get_renderer()
    boxes = [label.get_window_extent(renderer) for label in labels]
    for a, b in itertools.combinations(boxes, 2):
        assert disjoint(a, b), (a, b)
    strip = next(ax for ax in figure.axes if ax.get_label() == "incidents").get_window_extent(renderer)
    assert all(strip.x0 - 1 <= box.x0 and box.x1 <= strip.x1 + 1 for box in boxes), "none runs into the legend"


def test_incidents_too_dense_to_name_keep_their_labels_apart_and_are_counted():
    """120 incidents of three kinds, many within a few steps of each other: the lanes fill,
    no two labels of a lane come closer than the gap, and the legend counts the rest."""
    xs = np.random.default_rng(7).uniform(0, 10_000, 120)
    incidents = [{"x": float(x), "step": int(x), "kind": ("grad_spike", "straggler", "slowdown")[i % 3],
                  "label": "", "subrun": "1.00"} for i, x in enumerate(xs)]
    labels = place_labels(incident_labels(incidents, (0.0, 10_000.0)), (0.0, 10_000.0), lambda text: 7.0 * len(text))
    assert sum(label.count for label in labels) == 120
    placed = [label for label in labels if label.lane is not None]
    assert {label.lane for label in placed} == set(range(MAX_LANES)) and len(placed) < len(labels)
    figure = build_figure([{"title": "dense", "metric": "loss", "axis_label": "loss", "log_y": False,
                            "x_axis": "step", "x_label": "step", "subruns": ["1.00"], "notes": [],
                            "segments": [{"subrun": "1.00", "kept": True, "steps": [0, 10_000], "x": [0, 10_000],
                                          "values": [3.0, 2.0]}], "incidents": incidents, "skip_windows": []}])
    drawn = drawn_labels(figure)
    renderer = figure.canvas.get_renderer()
    for a, b in itertools.combinations([label.get_window_extent(renderer) for label in drawn], 2):
        assert disjoint(a, b, gap=LABEL_GAP_PX / 2), (a, b)
    named = sum(int(label.get_text().split("×")[1]) if "×" in label.get_text() else 1 for label in drawn)
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert f"{120 - named} incidents too close to label" in legend


def test_a_label_at_the_right_edge_goes_left_of_its_line():
    labels = place_labels([IncidentLabel(995.0, "storage_outage", 1)], (0.0, 1000.0), lambda text: 100.0)
    assert labels[0].lane == 0 and labels[0].left_of_line


def test_a_bf16_run_gets_no_loss_scale_panel_and_the_picture_says_why(busy, tmp_path, capsys):
    assert main(["logbook", "plot", str(busy)]) == 0
    assert Path(capsys.readouterr().out.strip()).name == "loss-grad_norm-lr.png"
    with Logbook.open(busy, create=False) as book:
        metrics, notes = default_metrics(book)
        figure = build_figure(figures_data(book, metrics, notes=notes))
    assert metrics == ("loss", "grad_norm", "lr") and notes == [UNSCALED_NOTE]
    assert not [ax for ax in figure.axes if "loss scale" in ax.get_ylabel()]
    assert UNSCALED_NOTE in [text.get_text() for text in figure.texts]


def test_an_fp16_run_keeps_its_loss_scale_panel(tmp_path):
    with Logbook.open(write_busy_run(tmp_path / "fp16", loss_scaling=True), create=False) as book:
        assert default_metrics(book) == (("loss", "grad_norm", "lr", "loss_scale"), [])


def expected_tokens(subrun: str, step: int) -> int:
    """Tokens trained by ``step`` along ``subrun``'s history: full batches up to step 1,800,
    where 12.03 resumed with a replica fewer; 12.04 resumed from 12.03's step 2,300."""
    if subrun < "12.03" or step <= 1800:
        return step * FULL_BATCH
    return 1800 * FULL_BATCH + (step - 1800) * SHRUNK_BATCH


def test_the_tokens_axis_counts_each_step_s_own_history(busy):
    with Logbook.open(busy, create=False) as book:
        figures = figures_data(book, ("loss",), "tokens")
    points = [(s["subrun"], step, x) for s in figures[0]["segments"] for step, x in zip(s["steps"], s["x"])]
    assert len(points) > 1000
    assert all(x == expected_tokens(subrun, step) for subrun, step, x in points)
    fault = next(mark for mark in figures[0]["incidents"] if mark["kind"] == "device_fault")
    assert fault["x"] == 1850 * FULL_BATCH
    figure = build_figure(figures)
    axis = figure.axes[-1]
    total = expected_tokens("12.04", 3000)
    assert axis.get_xlabel() == "tokens trained"
    assert axis.get_xlim()[0] <= 0 and total <= axis.get_xlim()[1] < total * 1.05
    assert tokens_text(2.5e9) == "2.5B" and tokens_text(350e6) == "350M"


def test_the_wall_axis_shows_the_downtime_between_sub_runs(busy):
    with Logbook.open(busy, create=False) as book:
        axis = x_axis(book, book.lineage(), "wall")
        figures = figures_data(book, ("loss",), "wall")
    # 12.00 trained 640 steps of 1.2 s from the launch; 12.01 began 240 s later, at step 501.
    assert axis.at("12.00", 640) == pytest.approx(640 * 1.2 / 60)
    assert axis.at("12.01", 501) == pytest.approx((640 * 1.2 + 240 + 1.2) / 60)
    spans = {}
    for segment in figures[0]["segments"]:
        low, high = spans.get(segment["subrun"], (np.inf, -np.inf))
        spans[segment["subrun"]] = (min(low, *segment["x"]), max(high, *segment["x"]))
    ordered = [spans[script.id] for script in SCRIPT]
    assert all(before[1] < after[0] for before, after in zip(ordered, ordered[1:])), "no sub-run drawn over another"
    figure = build_figure(figures)
    assert figure.axes[-1].get_xlabel() == "wall-clock time since the launch (min)"
    assert figure.axes[-1].get_xlim()[1] == pytest.approx(ordered[-1][1], rel=0.02)
    assert STEP_S[SHRUNK_BATCH] < STEP_S[FULL_BATCH]


def test_cli_draws_against_wall_clock_time(busy, tmp_path, capsys):
    png = tmp_path / "wall.png"
    assert main(["logbook", "plot", str(busy), "--metric", "loss", "--x", "wall", "--out", str(png)]) == 0
    assert capsys.readouterr().out.split() == [str(png)]
    assert png.read_bytes()[:4] == b"\x89PNG"
