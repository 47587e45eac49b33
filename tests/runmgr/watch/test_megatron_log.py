"""Megatron-LM / MindSpeed-LLM log lines, with the variants seen in real logs."""

from __future__ import annotations

import math

from runmgr.watch.megatron_log import MegatronLogReader, parse_fields
from runmgr.watch.observations import (
    CheckpointObservation, LoadedCheckpoint, RankTimings, SaveStarted, StepObservation, WorkerExit,
)

CORE = (" [2024-09-03 16:02:57] iteration       50/  500000 | consumed samples:        51200 | elapsed time per "
        "iteration (ms): 12056.1 | throughput per GPU (TFLOP/s/GPU): 878.5 | learning rate: 4.744186E-06 | global "
        "batch size:  1024 | lm loss: 8.219823E+00 | loss scale: 131072.0 | grad norm: 35.929 | number of skipped "
        "iterations:   1 | number of nan iterations:   0 |")
OLD = (" iteration      122/  250000 | consumed samples:       124928 | elapsed time per iteration (ms): 86545.2 | "
       "learning rate: 9.150E-06 | global batch size:  1024 | lm loss: 2.504220E+00 | loss scale: 1.0 | grad norm: "
       "0.231 | number of skipped iterations:   0 | number of nan iterations:   0 |")


def read(lines):
    return list(MegatronLogReader().events(lines))


def test_a_megatron_core_line_gives_every_field():
    (obs,) = read([CORE])
    assert isinstance(obs, StepObservation)
    assert (obs.step, obs.consumed_samples, obs.global_batch) == (50, 51200, 1024)
    assert obs.loss == 8.219823 and obs.grad_norm == 35.929 and obs.loss_scale == 131072.0
    assert obs.lr == 4.744186e-06 and math.isclose(obs.step_time, 12.0561)
    assert obs.skipped_iterations == 1 and obs.nan_iterations == 0
    assert obs.time == 1725379377.0  # 2024-09-03 16:02:57 read as UTC


def test_an_older_line_without_stamp_takes_its_time_from_elapsed_time_per_iteration():
    second = OLD.replace("122/", "124/").replace("124928", "126976")
    first, nxt = read([OLD, second])
    assert first.time == 86.5452 and nxt.iterations == 2
    assert math.isclose(nxt.time, 86.5452 + 2 * 86.5452)


def test_skipped_iterations_print_no_loss_and_no_grad_norm():
    line = (" iteration        2/  508626 | consumed samples:          576 | elapsed time per iteration (ms): 243438.3 "
            "| learning rate: 0.000E+00 | global batch size:   288 | loss scale: 2147483648.0 | number of skipped "
            "iterations:   1 | number of nan iterations:   0 |")
    (obs,) = read([line])
    assert obs.loss is None and obs.grad_norm is None and obs.skipped


def test_variants_iso_stamp_seconds_avg_max_tokens_and_srun_prefix():
    iso = ("[2025-10-21T16:18:53+08:00] iteration       51/   20000 | consumed samples:         3264 | elapsed time "
           "per iteration (ms): 6049.0/6100.2 | learning rate: 2.550000E-06 | global batch size:    64 | lm loss: "
           "1.959154E+00 | loss scale: 1.0 | grad norm: 30.855 | tokens/sec/gpu: 10839.5 | number of skipped "
           "iterations:   0 | number of nan iterations:   0 |")
    seconds = ("1: iteration        2/   95367 | consumed samples:         4096 | consumed tokens:      8388608 | "
               "elapsed time per iteration (s): 769.99 | learning rate: 3.787E-06 | global batch size:  2048 | "
               "lm loss: 6.384045E+01 | loss scale: 4096.0 | grad norm: 15906.210 | number of skipped iterations:"
               "   0 | number of nan iterations:   0 | samples per second: 2.660 |")
    (a,) = read([iso])
    assert a.time == 1761034733.0 and math.isclose(a.step_time, 6.049) and a.tokens_per_s == 10839.5
    (b,) = read([seconds])
    assert b.step == 2 and b.step_time == 769.99 and b.tokens_per_s is None


def test_current_time_field_and_nan_grad_norm():
    line = (" iteration        1/   30000 | current time: 1706860208.35 | consumed samples:           16 | elapsed "
            "time per iteration (ms): 1996.1 | learning rate: 0.000E+00 | global batch size:    16 | loss scale: "
            "1.0 | grad norm: nan | number of skipped iterations:   0 | number of nan iterations:   0 |")
    (obs,) = read([line])
    assert obs.time == 1706860208.35 and math.isnan(obs.grad_norm) and obs.loss is None


def test_checkpoints_restarts_and_other_lines():
    lines = [
        "validation loss at iteration 1 | lm loss value: 4.280033E-01 | lm loss PPL: 1.534191E+00 |",
        OLD,
        "  successfully saved checkpoint from iteration     122 to /fsx/ckpt [ t 1/8, p 1/1 ]",
        "time (ms) | forward-compute: 53.79 | backward-compute: 138.84",
        OLD.replace("122/", "123/"),
        OLD.replace("122/", "100/"),  # the job restarted from an older checkpoint
        "   successfully saved checkpoint at iteration     200 to /old/ckpt",
    ]
    events = read(lines)
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["StepObservation", "CheckpointObservation", "StepObservation", "StepObservation",
                     "CheckpointObservation"]
    assert events[1] == CheckpointObservation(step=122, time=events[0].time, consumed_samples=124928, subrun="00")
    assert [e.subrun for e in events if isinstance(e, StepObservation)] == ["00", "00", "01"]


def test_a_fatal_error_line_becomes_a_worker_exit_with_its_rank():
    line = ("[rank3]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600060 milliseconds")
    (exit_,) = read([OLD, line])[1:]
    assert isinstance(exit_, WorkerExit) and exit_.rank == 3 and "Watchdog" in exit_.text


def test_fields_split_on_the_first_colon_only():
    assert parse_fields(" elapsed time: 1:02:03 | lm loss: 2.0 |") == {"elapsed time": "1:02:03", "lm loss": "2.0"}


SAVING = "saving checkpoint at iteration      50 to /ckpt in torch_dist format"
LOADED = "  successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 40"
# megatron/core/utils.py StragglerDetector.report: rank 0 logs it after the iteration line
STRAGGLER = ("[2024-09-03 16:03:10] | MnRtt/Rnk: 1052.20ms/3 | MxRtt/Rnk: 1400.50ms/7 | MnPwr/Rnk: 310.00W/2 | "
             "MxPwr/Rnk: 520.00W/5 | MnTmp/Rnk: 40.00C/1 | MxTmp/Rnk: 61.00C/6 | MnUtl/Rnk: 88.00%/7 | "
             "MxUtl/Rnk: 99.00%/3 | MnClk/Rnk: 1400.00MHz/4 | MxClk/Rnk: 1980.00MHz/0 | MnDRtt/Rnk: 0.12us/1 | "
             "MxDRtt/Rnk: 0.40us/2 | MnEtpt/Rnk: 180.12TF/7 | MxEtpt/Rnk: 240.33TF/3")


def test_save_start_load_and_straggler_lines_are_observations():
    reader = MegatronLogReader()
    events = [reader.parse(line) for line in (CORE, SAVING, LOADED, STRAGGLER)]
    assert events[1] == SaveStarted(step=50, time=events[0].time, subrun="00")
    assert events[2] == LoadedCheckpoint(step=40, path="/ckpt", time=events[0].time, subrun="00")
    timings = events[3]
    assert isinstance(timings, RankTimings) and timings.step == 50
    assert timings.seconds == {3: 1.0522, 7: 1.4005}


def test_a_live_line_takes_its_arrival_time_and_the_subruns_id():
    reader = MegatronLogReader(subrun="12.03")
    step = reader.parse(CORE, received_at=500.0)
    saved = reader.parse("  successfully saved checkpoint from iteration      50 to /ckpt [ t 1/1, p 1/1 ]",
                         received_at=501.5)
    assert (step.time, step.subrun) == (500.0, "12.03")
    assert (saved.step, saved.time, saved.subrun) == (50, 501.5, "12.03")
    assert reader.parse(CORE).time == 1725379377.0  # without it (a replay), the line's own stamp


def test_the_rerun_machines_exit_message_is_a_worker_exit():
    line = ("WARNING:megatron.core.rerun_state_machine:Saving a checkpoint and exiting now. Please resume the job "
            "from the checkpoint to rerun the last iteration and establish a diagnostic")
    (event,) = read([CORE, line])[1:]
    assert isinstance(event, WorkerExit) and "resume the job" in event.text
