"""`runmgr logbook export --format md`: the chronicle as Markdown, read back
the way a team's notes would show it (markdown-it, CommonMark with GFM tables)."""

from __future__ import annotations

import shutil
import time
import types
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from logbook import Logbook
from logbook import markdown
from logbook.markdown import export_markdown
from logbook.report import ClassCost
from runmgr.cli import main
from tests.logbook.conftest import (NODE_B, T0, FakeClock, ScriptedRun, decision_dict, incident_dict, judged,
                                    train, workers_started)

HOSTILE = "| <script>alert(1)</script> # x"
EFFECTIVE = ("effective optimizer at step 20: betas (0.9, 0.95), eps 1e-08, lr scale 0.5, clip 0.5, "
             "fresh Adam state (step 0, zero moments)")


def command(book: Logbook, subrun: str, extra: str = "") -> None:
    """What the LogbookObserver records for each node of a Megatron job."""
    argv = ["torchrun", "--nnodes", "2", "pretrain_gpt.py", "--load", "checkpoints", *([extra] if extra else [])]
    message = "node 0: NCCL_DEBUG=WARN " + " ".join(argv)
    book.record_event(subrun, "command", message, {"node_rank": 0, "argv": argv, "env": {"NCCL_DEBUG": "WARN"}})


def write_megatron_run(run_dir: Path, hostile: str = "") -> ScriptedRun:
    """5.00 loses rank 1 at step 23; 5.01 resumes from step 20 and spikes at 30; 5.02 rolls back to 20
    with a skip range, half the LR (a config change too), an Adam reset and node B excluded, and
    finishes at 40. Every sub-run records its command; ``hostile`` goes into whatever a run can name."""
    run = ScriptedRun(run_dir, FakeClock())
    config = {"run": {"name": f"gpt{hostile}", "number": 5, "dir": str(run_dir)}, "optim": {"lr": 3e-3, "clip_grad": 1.0},
              "data": {"path": "data/train"}}
    plan = {"subrun": "5.00", "start_checkpoint": None, "skip_ranges": [], "lr_scale": 1.0, "rewarmup_iters": 0,
            "clip_grad": None, "reset_optimizer": False}
    ckpt = str(run_dir / "checkpoints" / "step_{:08d}")
    bad_node = NODE_B + hostile
    with Logbook.open(run_dir, clock=run.clock) as book:
        book.start_subrun("5.00", "launch", {}, None, 0, plan, config)
        command(book, "5.00", hostile)
        workers_started(book, "5.00", run.clock)
        train(book, run, "5.00", 1, 23, checkpoint_every=10)
        death = incident_dict("worker_death", f"rank 1 on {NODE_B} died: process killed (exit code -9){hostile}", None,
                              ranks=[1], nodes=[NODE_B], evidence={"cause": "killed", "exit_code": -9})
        restart = decision_dict("restart", f"rank 1 died; restart from the newest verified checkpoint{hostile}",
                                restart_from_step=20)
        summary = judged(book, "5.00", death, restart, 23)
        run.clock.advance(4.0)

        book.start_subrun("5.01", summary, {"incident": death, "decision": restart, "excluded_nodes": []},
                          ckpt.format(20), 20, {**plan, "subrun": "5.01", "start_checkpoint": ckpt.format(20)}, config)
        command(book, "5.01")
        workers_started(book, "5.01", run.clock)
        train(book, run, "5.01", 21, 33, checkpoint_every=10)
        spike = incident_dict("loss_spike", "loss 9.1 at step 30 is 3.4x the running median 2.7", 30,
                              evidence={"baseline": 2.7, "peak": 9.1, "z": 14.2})
        rollback = decision_dict("rollback_skip", "the spike did not recover within 3 steps", restart_from_step=20,
                                 skip_ranges=[[432, 528]], lr_factor=0.5, reset_optimizer=True, exclude_nodes=[bad_node])
        judged(book, "5.01", spike, rollback, 33)
        run.clock.advance(3.0)

        lowered = {**config, "optim": {"lr": 1.5e-3, "clip_grad": 1.0}, "data": {"path": f"data/train{hostile}"}}
        book.start_subrun("5.02", f"loss_spike at step 30: {spike['description']}",
                          {"incident": spike, "decision": rollback, "excluded_nodes": [bad_node]}, ckpt.format(20), 20,
                          {**plan, "subrun": "5.02", "start_checkpoint": ckpt.format(20), "skip_ranges": [[432, 528]],
                           "lr_scale": 0.5, "reset_optimizer": True}, lowered)
        command(book, "5.02")
        book.record_event("5.02", "effective_settings", EFFECTIVE, {"start_step": 20, "reset_optimizer": True}, step=20)
        workers_started(book, "5.02", run.clock)
        train(book, run, "5.02", 21, 40, checkpoint_every=10)
        if hostile:
            book.record_event("5.02", "note", f"operator says{hostile}", {})
        book.end_subrun("5.02", "finished", 40, "trained to step 40")
    return run


def export(run_dir: Path, name: str = "gpt.md") -> str:
    with Logbook.open(run_dir, create=False) as book:
        written = export_markdown(book, run_dir / name)
    assert written == run_dir / name
    return written.read_text(encoding="utf-8")


def section(text: str, subrun: str) -> str:
    """The lines of one sub-run's section."""
    start = text.index(f"\n## {subrun} — ")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def render(text: str) -> MarkdownIt:
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the table under ``heading`` as the viewer shows them (text, no markup)."""
    tokens = render(text).parse(text)
    start = next(i for i, t in enumerate(tokens) if t.type == "inline" and t.content == heading)
    rows, row = [], None
    for token in tokens[start:]:
        if token.type == "table_close":
            return rows
        if token.type == "tr_open":
            row = []
            rows.append(row)
        elif token.type == "inline" and row is not None:
            row.append("".join(child.content for child in token.children))
    raise AssertionError(f"no table under {heading}")


@pytest.fixture
def megatron_run(tmp_path: Path) -> ScriptedRun:
    return write_megatron_run(tmp_path / "runs" / "gpt")


def test_a_section_per_subrun_says_why_what_changed_where_and_how_far(megatron_run):
    text = export(megatron_run.run_dir)
    tokens = render(text).parse(text)
    headings = [f"{'#' * int(t.tag[1])} {tokens[i + 1].content}" for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings[:4] == ["# gpt — run 5", "## Summary", "## Cost by incident class", "## Plots"]
    assert [h.split(" — ")[0] for h in headings[4:]] == ["## 5.00", "## 5.01", "## 5.02"]
    assert headings[4].endswith("— from scratch") and headings[6].endswith("— from step 20")

    first, second, third = (section(text, s) for s in ("5.00", "5.01", "5.02"))
    assert "- **Why it started:** first launch" in first
    assert "- **Why it started:** worker_death: rank 1 on b7d41e09… died" in second
    assert "  - evidence: cause killed, exit_code -9" in second
    assert "  - decision: **restart** — rank 1 died; restart from the newest verified checkpoint" in second
    assert "- **Where it started:** checkpoint `checkpoints/step_00000020` (step 20)" in third
    changed = next(line for line in third.splitlines() if line.startswith("- **What changed:**"))
    for phrase in ("optim.lr 0.003 → 0.0015", "skip samples [432, 528)", "LR scale 1 → 0.5", "Adam reset",
                   "excluded node b7d41e09…"):
        assert phrase in changed
    assert f"  - {EFFECTIVE}" in third
    assert "  - evidence: baseline 2.7, peak 9.1, z 14.2" in third
    assert "- **How far it got:** trained steps 21–33 (13 recorded)" in second and "restarting at step 33" in second
    assert "- **What it cost:** steps lost: 13 (6.5 s of training redone), down 3.0 s before this start" in third
    assert "- **Checkpoints (2):** step 30 (`checkpoints/step_00000030`), step 40" in third
    assert "  - → **rollback_skip** — the spike did not recover within 3 steps" in second


def test_the_summary_and_cost_tables_hold_the_run_figures(megatron_run):
    text = export(megatron_run.run_dir)
    summary = dict(table_rows(text, "Summary")[1:])
    assert summary["run"] == "gpt — run 5" and summary["state"] == "finished"
    assert summary["sub-runs"] == "3" and summary["steps lost"] == "16"
    assert summary["steps kept"] == "40 (last step 40)" and summary["checkpoints"] == "5"
    assert summary["incidents"] == "2: loss_spike 1, worker_death 1"
    # 40 kept steps of 0.5 s; 39.5 s from the first start to the last end (workers up, steps, down times)
    assert summary["ETTR"] == "50.6% (time on kept steps / wall time = 20.0 s / 39.5 s)"
    costs = {row[0]: row[1:] for row in table_rows(text, "Cost by incident class")[1:]}
    # incidents, restarts, steps lost, redone, down, restart, wall time lost. Restart time runs to the
    # first step's start (its row's time less its step time, logbook/incident_costs.py); this run's rows
    # carry times from before their sub-run's start, so none is counted.
    assert costs["loss_spike"] == ["1", "1", "13", "6.5 s", "3.0 s", "0.0 s", "9.5 s"]
    assert costs["worker_death"] == ["1", "1", "3", "1.5 s", "4.0 s", "0.0 s", "5.5 s"]


def test_commands_are_a_fenced_block_to_paste(megatron_run):
    text = export(megatron_run.run_dir)
    fences = [t for t in render(text).parse(text) if t.type == "fence"]
    assert len(fences) == 3 and {f.info for f in fences} == {"sh"}
    assert fences[0].content == "# node 0\nNCCL_DEBUG=WARN torchrun --nnodes 2 pretrain_gpt.py --load checkpoints\n"


def test_a_hostile_string_from_the_run_stays_text(tmp_path):
    run_dir = write_megatron_run(tmp_path / "runs" / "gpt", hostile=HOSTILE).run_dir
    text = export(run_dir)
    html = render(text).render(text)
    assert "<script" not in html
    shown = "| &lt;script&gt;alert(1)&lt;/script&gt; # x"
    # title, summary cell, 5.00's incident and decision, 5.01's why, 5.02's node, config diff and note
    assert html.count(shown) >= 8
    tokens = render(text).parse(text)
    assert [t.tag for t in tokens if t.type == "heading_open"] == ["h1"] + ["h2"] * 6
    summary = table_rows(text, "Summary")
    assert all(len(row) == 2 for row in summary) and summary[1] == ["run", f"gpt{HOSTILE} — run 5"]
    # The command is pasted verbatim inside its fence, which nothing in it closes.
    assert any(HOSTILE in t.content for t in tokens if t.type == "fence")


def test_a_copied_run_directory_exports_the_same(megatron_run, tmp_path):
    copy = tmp_path / "elsewhere" / "gpt"
    shutil.copytree(megatron_run.run_dir, copy)
    shutil.rmtree(megatron_run.run_dir)  # nothing may be read from where the run was recorded
    text = export(copy)
    assert str(tmp_path) not in text
    rebuilt = write_megatron_run(tmp_path / "runs" / "gpt").run_dir
    assert export(rebuilt) == text


def test_plots_are_written_beside_the_document_and_linked_relatively(megatron_run):
    """One PNG per metric in ``<stem>.plots/``, linked with a relative, quoted path."""
    text = export(megatron_run.run_dir, "team notes.md")
    assert "## Plots\n\n![loss](team%20notes.plots/loss.png)\n\n![grad_norm](team%20notes.plots/grad_norm.png)" in text
    for metric in ("loss", "grad_norm", "lr", "loss_scale"):
        assert (megatron_run.run_dir / "team notes.plots" / f"{metric}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_with_the_run_report_its_costs_mtbi_and_ettr_series_are_shown(megatron_run, monkeypatch):
    """The run report's figures as the export words them (a report with round numbers)."""
    costs = (ClassCost("hang", 2, 1, 120, 60.0, 30.0, 90.0), ClassCost("loss_spike", 1, 1, 7, 3.5, 1.0, 2.0))
    series = ((T0 + 13.0, 0.9), (T0 + 25.0, 0.62), (T0 + 39.5, 0.506))
    monkeypatch.setattr(markdown, "run_report",
                        lambda book: types.SimpleNamespace(costs=costs, mtbi_s=75.0, ettr_series=series))
    text = export(megatron_run.run_dir)
    rows = table_rows(text, "Cost by incident class")
    assert rows[1:] == [["hang", "2", "1", "120", "1m 00s", "30.0 s", "1m 30s", "3m 00s"],
                        ["loss_spike", "1", "1", "7", "3.5 s", "1.0 s", "2.0 s", "6.5 s"]]
    summary = dict(table_rows(text, "Summary")[1:])
    assert summary["MTBI"] == "1m 15s (mean time between incidents that ended a sub-run)"
    times = [time.strftime("%H:%M:%S", time.localtime(at)) for at, _ in series]
    assert f"ETTR over time (at each sub-run's end): {times[0]} 90.0%, {times[1]} 62.0%, {times[2]} 50.6%" in text


def test_the_command_writes_the_run_dir_file_by_default(megatron_run, capsys):
    run_dir = megatron_run.run_dir
    assert main(["logbook", "export", str(run_dir), "--format", "md"]) == 0
    assert capsys.readouterr().out == f"{run_dir / 'gpt.md'}\n"
    assert (run_dir / "gpt.md").read_text(encoding="utf-8").startswith("# gpt — run 5\n")
    out = run_dir.parent / "notes.md"
    assert main(["logbook", "export", str(run_dir), "--out", str(out)]) == 0
    # The same document, its plots beside it under its own name.
    assert out.read_text(encoding="utf-8") == (run_dir / "gpt.md").read_text(encoding="utf-8").replace(
        "](gpt.plots/", "](notes.plots/")
    assert (run_dir.parent / "notes.plots" / "loss.png").is_file()


@pytest.mark.parametrize("args, says", [
    (["--format", "html"], "argument --format: invalid choice: 'html'"),
    (["--out", "{missing}/x.md"], "no folder {missing} to write x.md in"),
    (["--out", "{run}"], "is a folder: name the Markdown file to write"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(megatron_run, capsys, args, says):
    run_dir = megatron_run.run_dir
    before = sorted(run_dir.rglob("*"))
    places = {"missing": str(run_dir / "missing"), "run": str(run_dir)}
    assert exit_code(["logbook", "export", str(run_dir), *(a.format(**places) for a in args)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says.format(**places) in err and "Traceback" not in err
    assert sorted(run_dir.rglob("*")) == before


def test_export_flags_on_another_action_are_refused(megatron_run, capsys):
    assert exit_code(["logbook", "show", str(megatron_run.run_dir), "--out", "x.md"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("runmgr logbook show: error: unrecognized arguments: --out x.md")
    assert "--out is for `runmgr logbook plot` and `export`" in err
    assert exit_code(["logbook", "plot", str(megatron_run.run_dir), "--format", "md"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runmgr logbook plot: error: unrecognized arguments: --format md" in err
    assert "--format is for `runmgr logbook export`" in err


def exit_code(argv: list[str]) -> int:
    """The status ``runmgr`` exits with (argparse exits from inside; the commands return it)."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code
