"""Systems faults: hangs, deaths, devices, stragglers; budgets and restart storms."""

from __future__ import annotations

from runmgr.policy.checkpoints import VerifiedCheckpoint
from runmgr.config.policy import HardwareConfig, PolicyConfig, RestartConfig, RollbackConfig
from runmgr.policy.decision import ABORT, DUMP_AND_RESTART, EXCLUDE_NODE, IGNORE, RESTART
from runmgr.policy.history import History
from runmgr.policy.ladder import decide
from runmgr.watch.incidents import DEVICE_FAULT, EARLY_EXIT, HANG, SLOWDOWN, STRAGGLER, WORKER_DEATH, Incident

CHECKPOINTS = (VerifiedCheckpoint(400, 400 * 64), VerifiedCheckpoint(600, 600 * 64))


def death(category, cause, subrun="12.00", node="node-2", rank=5, time=0.0):
    return Incident(kind=WORKER_DEATH, time=time, description=f"rank {rank} died", subrun=subrun, ranks=(rank,),
                    nodes=(node,) if node else (),
                    evidence={"cause": cause, "category": category, "hint": f"look at {cause}"})


def run(incidents, config=PolicyConfig(), checkpoints=CHECKPOINTS):
    history, decisions = History(), []
    for incident in incidents:
        decision = decide(incident, history, config, checkpoints)
        history = history.record(incident, decision, checkpoints)
        decisions.append(decision)
    return decisions


def test_a_hang_dumps_stacks_and_restarts_from_the_newest_checkpoint():
    hang = Incident(kind=HANG, time=0.0, description="silent", subrun="12.00", onset_step=612, ranks=(1,),
                    nodes=("node-0",), evidence={"silent": [{"rank": 1, "node": "node-0", "phase": "step",
                                                             "step": 612, "silent_s": 130.0, "timeout_s": 120.0}]})
    decision = decide(hang, History(), PolicyConfig(), CHECKPOINTS)
    assert (decision.action, decision.restart_from_step, decision.dump_stacks) == (DUMP_AND_RESTART, 600, True)
    assert "silent for 130 s in phase step at step 612 (timeout 120 s)" in decision.reason


def test_network_deaths_restart_hardware_deaths_exclude_the_node_bugs_abort():
    network = decide(death("network", "nccl_timeout"), History(), PolicyConfig(), CHECKPOINTS)
    assert (network.action, network.restart_from_step, network.exclude_nodes) == (RESTART, 600, ())
    hardware = decide(death("hardware", "npu_uce"), History(), PolicyConfig(), CHECKPOINTS)
    assert (hardware.action, hardware.exclude_nodes, hardware.restart_from_step) == (EXCLUDE_NODE, ("node-2",), 600)
    bug = decide(death("bug", "bug"), History(), PolicyConfig(), CHECKPOINTS)
    assert bug.action == ABORT and "look at bug" in bug.reason


def test_a_hardware_death_without_a_known_node_restarts():
    decision = decide(death("hardware", "cuda_ecc", node=""), History(), PolicyConfig(), CHECKPOINTS)
    assert decision.action == RESTART


def test_no_checkpoint_yet_restarts_from_initialisation():
    decision = decide(death("killed", "killed"), History(), PolicyConfig(), ())
    assert decision.action == RESTART and decision.restart_from_step is None
    assert "initialisation" in decision.reason


def test_a_restart_storm_stops_the_run_naming_the_checkpoint():
    deaths = [death("network", "nccl_timeout", subrun=f"12.{n:02d}") for n in range(4)]
    decisions = run(deaths, PolicyConfig(restarts=RestartConfig(storm_restarts=3)))
    assert [d.action for d in decisions] == [RESTART, RESTART, RESTART, ABORT]
    assert "restart storm: the last 3 restarts" in decisions[3].reason
    assert "checkpoint step 600" in decisions[3].reason


def test_restarts_that_produce_newer_checkpoints_are_not_a_storm():
    history, config = History(), PolicyConfig(restarts=RestartConfig(storm_restarts=2))
    checkpoints = list(CHECKPOINTS)
    for n in range(5):
        incident = death("network", "nccl_timeout", subrun=f"12.{n:02d}")
        decision = decide(incident, history, config, checkpoints)
        assert decision.action == RESTART
        history = history.record(incident, decision, checkpoints)
        checkpoints.append(VerifiedCheckpoint(800 + 200 * n, None))  # the sub-run got past it


def test_a_spent_restart_budget_stops_the_run():
    deaths = [death("network", "nccl_error", subrun=f"12.{n:02d}") for n in range(3)]
    config = PolicyConfig(restarts=RestartConfig(max_restarts=2, storm_restarts=10))
    decisions = run(deaths, config)
    assert [d.action for d in decisions] == [RESTART, RESTART, ABORT]
    assert "restart budget is spent (2 of 2" in decisions[2].reason


def device_fault(node, time=0.0):
    return Incident(kind=DEVICE_FAULT, time=time, description="ecc", nodes=(node,),
                    evidence={"reason": "uncorrectable_ecc", "device": 3})


def test_a_device_fault_excludes_its_node_once_even_while_a_restart_is_under_way():
    history, config = History(), PolicyConfig()
    first = death("device", "cuda_error")
    history = history.record(first, decide(first, history, config, CHECKPOINTS), CHECKPOINTS)
    fault = decide(device_fault("node-7"), history, config, CHECKPOINTS)
    assert fault.action == EXCLUDE_NODE and fault.exclude_nodes == ("node-7",)
    history = history.record(device_fault("node-7"), fault, CHECKPOINTS)
    again = decide(device_fault("node-7"), history, config, CHECKPOINTS)
    assert again.action == IGNORE and "already excluded" in again.reason


def test_the_exclusion_budget_stops_the_run():
    config = PolicyConfig(hardware=HardwareConfig(max_excluded_nodes=2), restarts=RestartConfig(storm_restarts=9))
    decisions = run([device_fault(f"node-{n}") for n in range(3)], config)
    assert [d.action for d in decisions] == [EXCLUDE_NODE, EXCLUDE_NODE, ABORT]
    assert "budget 2; already out: node-0, node-1" in decisions[2].reason


def straggler(node, time, subrun="12.00"):
    return Incident(kind=STRAGGLER, time=time, description="slow", subrun=subrun, ranks=(3,), nodes=(node,))


def test_a_node_that_keeps_straggling_is_excluded_on_the_third_strike():
    decisions = run([straggler("node-4", t) for t in (0.0, 600.0, 1200.0)])
    assert [d.action for d in decisions] == [IGNORE, IGNORE, EXCLUDE_NODE]
    assert "node-4: strike 2 of 3" in decisions[1].reason
    assert decisions[2].exclude_nodes == ("node-4",)


def test_old_strikes_fall_out_of_the_window():
    decisions = run([straggler("node-4", t) for t in (0.0, 5000.0, 10000.0)])
    assert [d.action for d in decisions] == [IGNORE, IGNORE, IGNORE]


def test_a_slowdown_is_recorded_by_default():
    slow = Incident(kind=SLOWDOWN, time=0.0, description="slow", subrun="12.00", onset_step=900,
                    evidence={"drop": 0.4, "max_drop": 0.25})
    decision = decide(slow, History(), PolicyConfig(), CHECKPOINTS)
    assert decision.action == IGNORE and "40% below" in decision.reason
    assert decide(slow, History(), PolicyConfig(slowdown_action=RESTART), CHECKPOINTS).action == RESTART


def bad_checkpoint(step, subrun="12.01"):
    path = f"/runs/12/checkpoints/step_{step:08d}"
    return Incident(kind=WORKER_DEATH, time=0.0, description="rank 0 died", subrun=subrun, onset_step=step,
                    ranks=(0,), nodes=("node-2",),
                    evidence={"cause": "bad_checkpoint", "category": "checkpoint", "hint": "the checkpoint",
                              "checkpoint": path, "checkpoint_step": step})


def test_a_bad_checkpoint_is_rejected_for_the_newest_verified_one_before_it():
    decision = decide(bad_checkpoint(600), History(), PolicyConfig(), CHECKPOINTS)
    assert (decision.action, decision.restart_point, decision.restart_from_step) == (RESTART, "step", 400)
    assert "reject checkpoint /runs/12/checkpoints/step_00000600" in decision.reason
    assert "from the newest verified checkpoint before it (step 400) (restart 1 of 20)" in decision.reason


def test_rejections_step_back_one_checkpoint_each_until_the_storm_breaker_stops_them():
    checkpoints = (VerifiedCheckpoint(200), VerifiedCheckpoint(400), VerifiedCheckpoint(600), VerifiedCheckpoint(800))
    decisions = run([bad_checkpoint(step, f"12.{n:02d}") for n, step in enumerate((800, 600, 400, 200))],
                    checkpoints=checkpoints)
    assert [d.restart_from_step for d in decisions[:3]] == [600, 400, 200]
    assert decisions[3].action == ABORT and "restart storm" in decisions[3].reason


def test_a_bad_first_checkpoint_restarts_from_initialisation_only_while_the_run_is_young():
    young = decide(bad_checkpoint(400), History(), PolicyConfig(), CHECKPOINTS)
    assert (young.action, young.restart_point, young.restart_from_step) == (RESTART, "step", None)
    assert "initialisation (no verified checkpoint before it)" in young.reason
    old = PolicyConfig(rollback=RollbackConfig(from_scratch_within_steps=300))
    refused = decide(bad_checkpoint(400), History(), old, CHECKPOINTS)
    assert refused.action == ABORT and "would lose 400 steps" in refused.reason


def test_a_checkpoint_death_that_names_no_checkpoint_is_a_plain_restart():
    unnamed = Incident(kind=WORKER_DEATH, time=0.0, description="rank 0 died", subrun="12.01", ranks=(0,),
                       evidence={"cause": "bad_checkpoint", "category": "checkpoint"})
    decision = decide(unnamed, History(), PolicyConfig(), CHECKPOINTS)
    assert (decision.action, decision.restart_point, decision.restart_from_step) == (RESTART, "newest_at_restart", 600)


def test_a_rejection_spends_the_restart_budget():
    config = PolicyConfig(restarts=RestartConfig(max_restarts=1))
    decisions = run([death("killed", "killed"), bad_checkpoint(600)], config=config)
    assert decisions[1].action == ABORT and "restart budget is spent" in decisions[1].reason


def silent_at_start(never_stepped: bool) -> Incident:
    return Incident(kind=HANG, time=0.0, description="silent", subrun="1.00", onset_step=0, ranks=(0, 1),
                    evidence={"silent": [{"rank": 0, "node": "n", "phase": "init", "step": 0, "silent_s": 31.0,
                                          "timeout_s": 30.0}], "never_stepped": never_stepped,
                              "last_output": ["> building GPT model ..."]})


def test_a_job_that_never_printed_an_iteration_line_and_hangs_at_its_start_needs_a_person_at_once():
    decision = decide(silent_at_start(never_stepped=True), History(), PolicyConfig(), ())
    assert decision.action == ABORT and decision.dump_stacks
    assert "not printed a single iteration line" in decision.reason
    assert '"> building GPT model ..."' in decision.reason


def test_a_hang_at_the_start_of_a_job_that_trained_before_restarts():
    decision = decide(silent_at_start(never_stepped=False), History(), PolicyConfig(), CHECKPOINTS)
    assert decision.action == DUMP_AND_RESTART and decision.restart_from_step == 600


def early_exit(saved: bool, start: int = 400) -> Incident:
    return Incident(kind=EARLY_EXIT, time=0.0, description="exited 0", subrun="12.01", onset_step=612,
                    evidence={"last_step": 612, "final_step": 5000, "start_step": start, "saved_since_start": saved,
                              "steps_reported": 212, "last_output": ["iteration 612/5000 |"]})


def test_an_early_exit_after_a_save_goes_on_from_what_it_saved():
    decision = decide(early_exit(saved=True), History(), PolicyConfig(), CHECKPOINTS)
    assert (decision.action, decision.restart_from_step) == (RESTART, 600)
    assert "--exit-duration-in-mins" in decision.reason


def test_an_early_exit_that_saved_nothing_new_needs_a_person():
    decision = decide(early_exit(saved=False, start=600), History(), PolicyConfig(), CHECKPOINTS)
    assert decision.action == ABORT
    assert "saved no checkpoint newer than step 600" in decision.reason and "iteration 612/5000" in decision.reason
