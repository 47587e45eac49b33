"""Replay: detectors and policy over recorded logs, without training."""

from __future__ import annotations

import io
import json
from pathlib import Path

from runmgr.replay import main_replay, read_events, replay
from tests.runmgr.watch.absurd_lines import FIELD_CASES, LINE_CASES, iteration_line
from tests.runmgr.watch.conftest import make_trace

FIXTURES = Path(__file__).parent / "watch" / "fixtures"
SPIKE_LOG = str(FIXTURES / "megatron_spike.log")
CLEAN_LOG = str(FIXTURES / "megatron_clean.log")


def run(path, as_json=False, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    code = main_replay(path, as_json, out, err, **kwargs)
    return code, out.getvalue(), err.getvalue()


def test_the_spike_log_prints_the_transient_spike_ignored_and_the_persistent_one_rolled_back():
    code, out, err = run(SPIKE_LOG)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert "steps 10-6000" in lines[0] and "2 sub-run(s)" in lines[0] and "12 checkpoint(s)" in lines[0]
    transient = next(i for i, line in enumerate(lines) if "loss_spike at step 2351" in line)
    assert "(recovered)" in lines[transient] and lines[transient + 1].strip().startswith("-> ignore:")
    persistent = next(i for i, line in enumerate(lines) if "loss_spike at step 4211" in line)
    decision = lines[persistent + 1]
    assert "-> rollback_skip:" in decision
    assert "restart from verified checkpoint 4000" in decision
    # 100 steps before the onset to 200 after it, at 1024 samples per step, from the onset's position.
    assert "skip samples [4208640, 4515840)" in decision


def test_the_spike_log_as_json_carries_the_plan_changes():
    code, out, _ = run(SPIKE_LOG, as_json=True)
    report = json.loads(out)
    rollbacks = [item for item in report["incidents"] if item["decision"]["action"] == "rollback_skip"]
    assert len(rollbacks) == 1
    incident, decision = rollbacks[0]["incident"], rollbacks[0]["decision"]
    assert incident["kind"] == "loss_spike" and incident["onset_step"] == 4211 and not incident["recovered"]
    assert decision["restart_from_step"] <= 4211 - 100
    assert decision["skip_ranges"] == [[4208640, 4515840]]
    assert report["subruns"] == ["00", "01"]


def test_the_clean_log_prints_no_incident():
    code, out, err = run(CLEAN_LOG)
    assert code == 0 and err == ""
    assert out.splitlines()[-1] == "no incidents"
    assert json.loads(run(CLEAN_LOG, as_json=True)[1])["incidents"] == []


def test_a_missing_file_is_one_line_and_exit_2(tmp_path):
    code, out, err = run(str(tmp_path / "nope.log"))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "no such file" in err and "nope.log" in err


def test_a_directory_or_a_file_without_steps_is_one_line_and_exit_2(tmp_path):
    code, _, err = run(str(tmp_path))
    assert code == 2 and "is a directory" in err and err.count("\n") == 1
    junk = tmp_path / "notes.txt"
    junk.write_text("hello\nthis is not a training log\n")
    code, _, err = run(str(junk))
    assert code == 2 and "no training steps found" in err and err.count("\n") == 1


def test_a_bad_jsonl_line_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "metrics.jsonl"
    bad.write_text('{"step": 1, "loss": 2.0, "time": 1.0}\n{not json}\n{"step": 3, "loss": 2.0, "time": 3.0}\n')
    code, _, err = run(str(bad))
    assert code == 2 and "metrics.jsonl:2" in err and err.count("\n") == 1


def test_jsonl_replay_of_a_spiky_trace_with_an_assumed_save_interval(tmp_path):
    observations = make_trace(1400, 21, spikes=((1100, 5000, 0.5),))
    path = tmp_path / "metrics.jsonl"
    with path.open("w") as handle:
        for o in observations:
            handle.write(json.dumps({"subrun": o.subrun, "step": o.step, "loss": o.loss, "grad_norm": o.grad_norm,
                                     "time": o.time, "step_time": o.step_time, "tokens_per_s": o.tokens_per_s,
                                     "consumed_samples": o.consumed_samples, "skipped": False}) + "\n")
    code, out, _ = run(str(path), as_json=True, save_interval=250)
    decisions = [item["decision"] for item in json.loads(out)["incidents"]]
    assert decisions[0]["action"] == "rollback_skip" and decisions[0]["restart_from_step"] == 1000


def test_replay_is_deterministic():
    lines = Path(SPIKE_LOG).read_text().splitlines(keepends=True)
    fmt, events = read_events(lines, SPIKE_LOG)
    assert replay(events, fmt) == replay(read_events(lines, SPIKE_LOG)[1], fmt)


def test_the_run_s_own_thresholds_judge_the_log():
    """The same log, judged with the demo's watcher and a 5-step grace: the spike that
    recovered in 29 steps is now persistent and rolled back; with the defaults it is not."""
    default = json.loads(run(SPIKE_LOG, as_json=True)[1])["incidents"]
    code, out, err = run(SPIKE_LOG, as_json=True, conf="demo", overrides=["watcher.loss_spike.grace_steps=5"])
    assert code == 0 and err == ""
    tight = json.loads(out)["incidents"]
    first = {item["incident"]["onset_step"]: item["decision"] for item in default if item["incident"]["kind"] == "loss_spike"}
    again = {item["incident"]["onset_step"]: item["decision"] for item in tight if item["incident"]["kind"] == "loss_spike"}
    assert first[2351]["action"] == "ignore" and again[2351]["action"] == "rollback_skip"
    # the demo policy's margin (10 steps), not the default's (100), chose the checkpoint
    assert "margin 10" in again[2351]["reason"]


def test_after_a_decision_ends_a_sub_run_the_replay_goes_on_as_the_next_one():
    code, out, _ = run(SPIKE_LOG, as_json=True, conf="demo", overrides=["watcher.loss_spike.grace_steps=5"])
    spikes = [item for item in json.loads(out)["incidents"] if item["incident"]["kind"] == "loss_spike"]
    assert [item["decision"]["action"] for item in spikes] == ["rollback_skip", "rollback_skip"]
    assert [item["incident"]["subrun"] for item in spikes] == ["00", "00+1"]
    assert "use 2 of 10" in spikes[1]["decision"]["reason"]  # one history, as in a live run


def test_overrides_without_a_config_or_with_a_wrong_key_are_one_line():
    code, out, err = run(SPIKE_LOG, overrides=["watcher.loss_spike.grace_steps=5"])
    assert code == 2 and out == "" and err.count("\n") == 1 and "need a config" in err
    code, out, err = run(SPIKE_LOG, conf="demo", overrides=["watcher.loss_spike.grace=5"])
    assert code == 2 and out == "" and err.count("\n") == 1 and "grace" in err


def test_megatrons_straggler_report_and_save_lines_are_replayed_through_the_same_judge(tmp_path):
    """A log with --log-straggler: rank 7 is the slowest in every report, well above the fastest."""
    lines = []
    for step in range(10, 310, 10):
        lines.append(f" [2024-09-03 16:{step // 60:02d}:{step % 60:02d}] iteration {step:8d}/    3000 | consumed "
                     f"samples: {step * 512:12d} | elapsed time per iteration (ms): 430.2 | learning rate: "
                     f"3.750E-04 | global batch size:   512 | lm loss: 2.500000E+00 | loss scale: 1.0 | grad norm: "
                     f"0.300 | number of skipped iterations:   0 | number of nan iterations:   0 |")
        lines.append(f"[2024-09-03 16:{step // 60:02d}:{step % 60:02d}] | MnRtt/Rnk: 400.10ms/2 | "
                     f"MxRtt/Rnk: 620.40ms/7 | MnPwr/Rnk: 310.00W/2 | MxEtpt/Rnk: 240.33TF/2")
        if step % 100 == 0:
            lines.append(f"saving checkpoint at iteration {step:8d} to /ckpt in torch_dist format")
            lines.append(f"  successfully saved checkpoint from iteration {step:8d} to /ckpt [ t 1/1, p 1/1 ]")
    log = tmp_path / "straggler.log"
    log.write_text("\n".join(lines) + "\n")
    code, out, err = run(str(log))
    assert code == 0 and err == ""
    assert "3 checkpoint(s)" in out.splitlines()[0]
    assert "straggler" in out and "rank 7" in out


def test_a_log_full_of_absurd_numbers_replays_and_lists_what_was_refused(tmp_path):
    """The absurd table (tests/runmgr/watch/absurd_lines.py) among valid lines: the replay does
    not raise, judges the valid steps and names every refused value with its field."""
    total = 30
    lines = []
    for step in range(1, total + 1):
        lines += [case.line(total) for case in LINE_CASES if case.step == step]
        lines += [next((case.line(total) for case in FIELD_CASES if case.step == step), iteration_line(step, total))]
    log = tmp_path / "absurd.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, err = run(str(log))
    assert code == 0 and err == ""
    header, refused = out.splitlines()[:2]
    assert f"{total} step records, steps 1-{total}" in header
    assert refused.startswith(f"{len(FIELD_CASES) + len(LINE_CASES)} value(s) refused as impossible")
    assert "\x1b" not in out  # a job's escape sequence is text, never a command to the terminal
    report = json.loads(run(str(log), as_json=True)[1])
    assert sorted(r["field"] for r in report["refused"]) == sorted(
        [case.name for case in FIELD_CASES] + [case.field for case in LINE_CASES])
