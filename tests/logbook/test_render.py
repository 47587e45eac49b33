import re

from logbook import Logbook
from logbook.changes import health_fact, node_changes, plan_changes
from logbook.render import chronicle, duration, pack, run_title
from logbook.textfmt import phrases, tidier

from tests.logbook.conftest import NODE_A, NODE_B, decision_dict, incident_dict, judged


def render(run_dir, width=100, title=None):
    with Logbook.open(run_dir, create=False) as book:
        lineage = book.lineage()
        return chronicle(title or run_title(lineage), lineage, book.events(), book.all_metrics(), book.costs(),
                         book.summary(), width, run_dir=str(run_dir))


def block(lines, subrun_id):
    """The lines of one sub-run's block."""
    start = next(i for i, line in enumerate(lines) if line.startswith(subrun_id + " "))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i]), len(lines))
    return "\n".join(lines[start:end])


def test_chronicle_tells_each_subrun_story(scripted_run):
    lines = render(scripted_run.run_dir)
    first, second, third = (block(lines, s) for s in ("7.00", "7.01", "7.02"))
    assert re.match(r"7\.00  \d\d:\d\d:\d\d  from scratch  \(first launch\)$", first.splitlines()[0])
    assert "restarting at step 67 — worker lost" in first
    assert "worker_lost at step 67, node node-b: rank 1 died" in first
    assert "→ restart — a worker died; resume from the last checkpoint" in first
    assert "checkpoints: 3, last step_00000060 (step 60)" in first
    assert "from step_00000060 (step 60)  after: worker lost" in second
    assert "steps lost: 7" in second and "down 10.0 s" in second
    assert "loss_spike at step 118: loss 9.1" in second and "→ rollback_skip_lower_lr — spike did not" in second
    assert "steps lost: 20" in third
    assert "changed: optim.lr 0.0003 → 0.00015; skip samples [3200, 3328); LR scale 1 → 0.5" in third
    assert "health_report: 4/4 nodes healthy" in third
    assert "finished at step 200" in third


def test_evidence_stays_out_of_the_timeline(scripted_run):
    text = "\n".join(render(scripted_run.run_dir))
    assert "ActorDiedError" not in text and "pid" not in text and "{" not in text


def test_header_carries_the_run_figures(scripted_run):
    with Logbook.open(scripted_run.run_dir, create=False) as book:
        summary = book.summary()
    head = "\n".join(render(scripted_run.run_dir)[:6])
    assert head.startswith("run 7\n")
    assert "sub-runs 3" in head and "steps kept 200" in head and "steps lost 27" in head
    # ETTR is defined where it is printed: a reader who never met the word can read it.
    assert (f"ETTR {summary['ettr']:.1%} (effective training time ratio: time on kept steps / wall time = "
            f"{duration(summary['kept_time_s'])} / {duration(summary['wall_time_s'])})") in head
    assert "paths below are relative to the run directory" in head
    assert "loss_spike 1, worker_lost 1" in head


def test_lines_fit_the_terminal(scripted_run, controller_run):
    for run_dir in (scripted_run.run_dir, controller_run.run_dir):
        for width in (80, 100):
            assert max(len(line) for line in render(run_dir, width)) <= width


def test_an_open_subrun_says_it_has_no_end(tmp_path, clock):
    with Logbook.open(tmp_path, clock=clock) as book:
        book.start_subrun("2.00", "launch", {}, None, 0, {}, {})
    assert "no end recorded" in block(render(tmp_path), "2.00")


# ---- what runmgr's controller writes --------------------------------------------------------


def test_a_controller_run_is_titled_by_its_config(controller_run):
    lines = render(controller_run.run_dir)
    assert lines[0] == "demo — run 1"
    assert "incidents 2 (loss_spike 1, worker_death 1)" in "\n".join(lines[:4])


def test_the_start_line_says_where_from_and_after_what(controller_run):
    lines = render(controller_run.run_dir)
    assert re.fullmatch(r"1\.01  \d\d:\d\d:\d\d  from step_00000010 \(step 10\)  after: worker_death \(rank 1 killed\)",
                        block(lines, "1.01").splitlines()[0])
    assert re.fullmatch(r"1\.02  \d\d:\d\d:\d\d  from step_00000020 \(step 20\)  after: loss_spike at step 30",
                        block(lines, "1.02").splitlines()[0])


def test_no_evidence_dict_or_absolute_path_is_dumped(controller_run):
    text = "\n".join(render(controller_run.run_dir))
    for raw in ('{"kind":', "{'kind'", '"evidence"', "'evidence'", "onset_sample", "exit_code", "{", "["):
        assert raw not in text.replace("samples [432, 528)", ""), raw
    assert str(controller_run.run_dir) not in text
    assert NODE_B not in text and NODE_B[:8] + "…" in text  # node ids shortened


def test_each_incident_is_told_once_with_its_decision_under_it(controller_run):
    lines = render(controller_run.run_dir)
    text = "\n".join(lines)
    assert text.count("died: process killed (exit code -9)") == 1
    assert text.count("is 3.4x the running median 2.7") == 1
    death = next(i for i, line in enumerate(lines) if "worker_death: rank 1 on" in line)
    assert re.match(r" {6}\d\d:\d\d:\d\d  worker_death: rank 1 on b7d41e09… died", lines[death])
    assert lines[death + 1].strip() == "→ restart — rank 1 died (killed); restart from the newest verified checkpoint"
    first = block(lines, "1.00")
    assert first.splitlines()[-1].strip().endswith("restarting at step 23")  # no summary repeated


def test_the_facts_of_a_start(controller_run):
    lines = render(controller_run.run_dir)
    first, second, third = (block(lines, s) for s in ("1.00", "1.01", "1.02"))
    assert "health check: 2 nodes, 2 admitted" in first and "2 workers up in 1.5 s" in first
    assert "steps lost: 13 (6.5 s of training redone), down 4.0 s before this start" in second
    assert "rejected step_00000020: checksum mismatch in checkpoints/step_00000020/model.pt" in second
    assert "checkpoints: 2, last step_00000030 (step 30)" in second
    rows = third.splitlines()
    at = next(i for i, row in enumerate(rows) if row.startswith("      changed: "))
    continued = [row.strip() for row in rows[at + 1:at + 3] if row.startswith(" " * 8)]
    changed = " ".join([rows[at].split("changed: ", 1)[1], *continued])
    assert changed == ("skip samples [432, 528); LR scale 1 → 0.5; clip 1 → 0.5; Adam reset; "
                       "re-warmup 5 steps; excluded node b7d41e09…")
    assert "needs_human: the loss spiked again at step 35" in third
    assert third.splitlines()[-1].strip().endswith("failed at step 36")  # the reason is the line above


def test_small_helpers():
    assert duration(3.5) == "3.5 s" and duration(252) == "4m 12s" and duration(7380) == "2h 03m"
    assert pack(["aaaa", "bbbb", "cccc"], width=14, indent="  ", separator=" ") == ["  aaaa bbbb", "  cccc"]
    assert phrases("x: ", ["aaaa", "bbbb", "cccc"], width=14, indent="  ", hang="    ") == [
        "  x: aaaa;", "    bbbb; cccc"]
    tidy = tidier(["/runs/a", None])
    assert tidy(f"/runs/a/checkpoints/step_1 on {NODE_B}") == "checkpoints/step_1 on b7d41e09…"
    assert tidy("/runs/ab/x") == "/runs/ab/x"


def test_paths_are_made_relative_to_the_run_only_where_they_start(tmp_path, monkeypatch):
    # The driver ran in /work/x with run dir runs/demo; an error names the absolute path. Cutting
    # "runs/demo/" out of its middle left "/work/x/checkpoints/...", a path that does not exist.
    monkeypatch.chdir(tmp_path)
    tidy = tidier(["runs/demo"])
    absolute = f"{tmp_path}/runs/demo/checkpoints/step_00000100"
    assert tidy(f"Read-only file system: '{absolute}'") == "Read-only file system: 'checkpoints/step_00000100'"
    assert tidy("resumed from runs/demo/checkpoints/step_20") == "resumed from checkpoints/step_20"
    assert tidy("/elsewhere/runs/demo/checkpoints/step_1") == "/elsewhere/runs/demo/checkpoints/step_1"


def hang_run(run_dir, clock, description: str):
    with Logbook.open(run_dir, clock=clock) as book:
        book.start_subrun("1.00", "launch", {}, None, 0, {}, {})
        hang = incident_dict("hang", description, 48, ranks=[0, 1], nodes=[NODE_A, NODE_B])
        judged(book, "1.00", hang, decision_dict("dump_and_restart", "ranks silent " + "and more " * 40), 47)


def test_the_hang_header_names_every_silent_rank_not_only_those_the_description_skips(tmp_path, clock):
    # Rank 0 was stopped; its peer waits in the collective. The description names rank 0 first;
    # the header used to keep only the ranks it did not name and read "hang at step 48, rank 1".
    hang_run(tmp_path, clock, "2 rank(s) silent in phase step: rank 0 for 5.0 s at step 48, timeout 5.0 s")
    text = "\n".join(render(tmp_path))
    assert "hang at step 48, ranks 0, 1, nodes 3f2a9c1e…, b7d41e09…: 2 rank(s) silent" in text
    assert "hang at step 48, rank 1" not in text


def test_long_decisions_are_cut_unless_full(tmp_path, clock):
    hang_run(tmp_path, clock, "2 rank(s) silent")
    with Logbook.open(tmp_path, create=False) as book:
        args = (run_title(book.lineage()), book.lineage(), book.events(), book.all_metrics(), book.costs(),
                book.summary(), 100)
    cut, full = "\n".join(chronicle(*args)), "\n".join(chronicle(*args, full=True))
    assert " …\n" in cut and cut.count("more") < 40
    assert not full.endswith("…") and " …\n" not in full and full.count("more") == 40


def test_plan_changes_are_phrases():
    assert plan_changes({"lr_scale": 1.0}, {"lr_scale": 0.5, "reset_optimizer": False}) == ["LR scale 1 → 0.5"]
    assert plan_changes({}, {"lr_scale": 1.0, "skip_ranges": [], "clip_grad": None, "reset_optimizer": False}) == []
    assert plan_changes({"skip_ranges": [[1, 5]]}, {"skip_ranges": [[1, 5], [9, 12]]}) == ["skip samples [9, 12)"]
    assert plan_changes({}, {"clip_grad": 0.3}, clip_default=1.0) == ["clip 1 → 0.3"]
    assert plan_changes({}, {"reset_optimizer": True, "rewarmup_iters": 4}) == ["Adam reset", "re-warmup 4 steps"]
    assert plan_changes({}, {"pipeline": "x"}) == ['pipeline (unset) → x']


def test_node_and_health_facts():
    assert node_changes({"excluded_nodes": ["n1", "n3"]}, {"excluded_nodes": ["n1"]}) == ["excluded node n3"]
    assert node_changes({"health": {"excluded": {"n2": ["slow"]}}}, None) == ["excluded node n2"]
    assert health_fact({"health": {"skipped": True, "excluded": {"n2": []}}}) == (
        "health check skipped; 1 node(s) kept out by the last check")
    assert health_fact({}) is None


def test_a_resize_is_a_change_in_words_and_a_first_size_or_the_nodes_are_not():
    assert plan_changes({"data_parallel_size": 2, "avoid_nodes": []},
                        {"data_parallel_size": 1, "avoid_nodes": ["n1"]}) == ["data parallel 2 → 1"]
    # the first sub-run's size is no news; the nodes show as "excluded node" from the evidence
    assert plan_changes({}, {"data_parallel_size": 2, "avoid_nodes": ["n9"]}) == []


def test_an_incidents_line_names_the_weights_whose_local_norm_moved_first():
    from logbook.render import incident_description

    norms = {"first_step": 56, "threshold": 3.0,
             "first": [{"name": "embedding.weight", "ratio": 12.34}, {"name": "blocks.1.mlp.down.weight", "ratio": 4.0}]}
    event = {"kind": "loss_spike", "step": 56, "summary": "loss_spike at step 56: loss 5.1",
             "evidence": {"description": "loss 5.1 over 2.3", "evidence": {"local_norms": norms}}}
    assert incident_description(event) == ("loss 5.1 over 2.3; local norms moved first at step 56: "
                                           "embedding.weight 12.3x, blocks.1.mlp.down.weight 4.0x")
    event["evidence"]["evidence"] = {}
    assert incident_description(event) == "loss 5.1 over 2.3"


def test_the_local_norms_a_rollback_asks_for_are_one_phrase_and_only_when_new():
    asked = {"local_norms_steps": list(range(41, 91))}
    assert plan_changes({"local_norms_steps": []}, asked) == ["local norms on steps 41–90"]
    assert plan_changes(asked, asked) == []
