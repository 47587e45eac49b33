from logbook import Logbook
from logbook.render import chronicle, duration, pack, plan_changes


def render(run_dir, width=100):
    with Logbook.open(run_dir, create=False) as book:
        return chronicle("run 7", book.lineage(), book.events(), book.all_metrics(), book.costs(),
                         book.summary(), width)


def block(lines, subrun_id):
    """The lines of one sub-run's block."""
    start = next(i for i, line in enumerate(lines) if line.startswith(subrun_id + " "))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i]), len(lines))
    return "\n".join(lines[start:end])


def test_chronicle_tells_each_subrun_story(scripted_run):
    lines = render(scripted_run.run_dir)
    first, second, third = (block(lines, s) for s in ("7.00", "7.01", "7.02"))
    assert "cause: launch" in first and "ended" in first and "restarting at step 67 — worker lost" in first
    assert "incident #" in first and "worker_lost at step 67, rank 1, node node-b" in first
    assert "checkpoints: 3, last step_00000060 (step 60)" in first
    assert "from step_00000060 (step 60) — cause: worker lost" in second
    assert "ActorDiedError" in second and "pid=4242" in second
    assert "steps lost: 7" in second and "down 10.0 s" in second
    assert "loss_spike at step 118" in second and "rollback_skip_lower_lr" in second
    assert "steps lost: 20" in third and "config: optim.lr 0.0003 → 0.00015" in third
    assert "lr_scale 1.0 → 0.5" in third and "[[3200, 3328]]" in third
    assert "health_report: 4/4 nodes healthy" in third
    assert "finished at step 200" in third


def test_header_carries_the_run_figures(scripted_run):
    with Logbook.open(scripted_run.run_dir, create=False) as book:
        summary = book.summary()
    head = "\n".join(render(scripted_run.run_dir)[:4])
    assert "sub-runs 3" in head and "steps kept 200" in head and "steps lost 27" in head
    assert f"ETTR {summary['ettr']:.1%}" in head
    assert "loss_spike 1, worker_lost 1" in head


def test_lines_fit_the_terminal(scripted_run):
    for width in (80, 100):
        assert max(len(line) for line in render(scripted_run.run_dir, width)) <= width


def test_an_open_subrun_says_it_has_no_end(tmp_path, clock):
    with Logbook.open(tmp_path, clock=clock) as book:
        book.start_subrun("2.00", "launch", {}, None, 0, {}, {})
    assert "no end recorded" in block(render(tmp_path), "2.00")


def test_small_helpers():
    assert duration(3.5) == "3.5 s" and duration(252) == "4m 12s" and duration(7380) == "2h 03m"
    assert plan_changes({"lr_scale": 1.0}, {"lr_scale": 0.5, "reset_optimizer": False}) == "lr_scale 1.0 → 0.5"
    assert plan_changes({}, {"excluded_nodes": ["n3"]}) == 'excluded_nodes=["n3"]'
    assert pack(["aaaa", "bbbb", "cccc"], width=14, indent="  ", separator=" ") == ["  aaaa bbbb", "  cccc"]
