"""``runmgr logbook skipped``: each skip range of a lineage, who added it and
why, and the real text of its first samples, rebuilt from the recorded config."""

from __future__ import annotations

import codecs
import io
import re

import pytest

from logbook import Logbook, LogbookError
from runmgr.cli import main
from runmgr.logbook_samples import printable, show_skipped, skipped_ranges
from trainer.config import DataConfig
from trainer.data import build_sample_stream
from trainer.data.corpus import corpus_tokens

CORPUS_BYTES = 20_000
SEQ_LENGTH = 64
SEED = 1234


def config(seed: int = SEED) -> dict:
    return {"run": {"name": "tiny", "number": 3, "dir": "/elsewhere/tiny"},
            "data": {"data_path": None, "corpus_max_bytes": CORPUS_BYTES},
            "model": {"seq_length": SEQ_LENGTH}, "training": {"seed": seed, "global_batch_size": 8}}


def plan(subrun: str, ranges: list) -> dict:
    return {"subrun": subrun, "start_checkpoint": None, "skip_ranges": ranges, "lr_scale": 1.0,
            "rewarmup_iters": 0, "clip_grad": None, "reset_optimizer": False}


def write_run(run_dir, seed: int = SEED) -> None:
    """3.00 spikes; 3.01 rolls back skipping samples [40, 52); 3.02 skips [52, 60) too (merged)."""
    reason = "loss spike did not recover within 3 steps; roll back and skip the samples of steps 6-7"
    with Logbook.open(run_dir) as book:
        book.start_subrun("3.00", "launch", {}, None, 0, plan("3.00", []), config(seed))
        book.end_subrun("3.00", "restarting", 7, "rollback_skip: loss_spike at step 6: ...")
        book.start_subrun("3.01", "loss_spike at step 6: loss 9.0 is 4x the median",
                          {"incident": {"kind": "loss_spike", "onset_step": 6},
                           "decision": {"action": "rollback_skip", "reason": reason}},
                          None, 0, plan("3.01", [[40, 52]]), config(seed))
        book.end_subrun("3.01", "restarting", 8, "rollback_skip: loss_spike at step 7: ...")
        book.start_subrun("3.02", "loss_spike at step 7: again", {}, None, 0, plan("3.02", [[40, 60]]), config(seed))


def shown_samples(text: str) -> dict[int, str]:
    """Position -> decoded text as printed (continuation lines joined), escapes undone."""
    samples: dict[int, str] = {}
    current, indent = None, 0
    for line in text.splitlines():
        header = re.match(r"^ +#(\d+)  (.*)$", line)
        if header:
            current, indent = int(header.group(1)), header.start(2)
            samples[current] = header.group(2)
        elif current is not None and len(line) > indent and line.startswith(" " * indent):
            samples[current] += line[indent:]
        else:
            current = None
    return {p: codecs.decode(t.encode("ascii", "backslashreplace"), "unicode_escape") for p, t in samples.items()}


def test_each_range_is_told_with_its_origin_and_real_text(tmp_path):
    write_run(tmp_path)
    out = io.StringIO()
    assert show_skipped(tmp_path, out, limit=2, chars=10_000) == 0
    text = out.getvalue()
    assert text.startswith("tiny — run 3: 2 skip ranges")
    assert "samples [40, 52)  12 samples, added by 3.01" in text
    assert "why: loss spike did not recover within 3 steps" in text
    assert "samples [40, 60)  20 samples, added by 3.02 (grows samples [40, 52))" in text
    assert "why: loss_spike at step 7: again" in text  # no decision recorded: the cause
    assert "… 10 more (--limit 12 shows them all)" in text
    assert "… 6 more (--limit 8 shows them all)" in text  # the grown range shows its new samples
    samples = shown_samples(text)
    assert sorted(samples) == [40, 41, 52, 53]
    corpus = corpus_tokens(CORPUS_BYTES).tobytes().decode("utf-8", errors="replace")
    stream = build_sample_stream(DataConfig(data_path=None, corpus_max_bytes=CORPUS_BYTES), SEQ_LENGTH, SEED)
    for position, sample in samples.items():
        assert sample == stream.decode(position)  # what the trainer reads at that position
        assert len(sample.encode("utf-8", errors="replace")) >= SEQ_LENGTH
        assert sample.strip("\ufffd") in corpus  # real text of the corpus, not a dump
    assert len(set(samples.values())) == 4
    assert max(len(line) for line in text.splitlines()) <= 100


def test_the_samples_at_the_incidents_onset_are_shown_first(tmp_path):
    """Issue 32: a rollback skips from its checkpoint on, and the range's first samples were not
    the ones the spike began on."""
    with Logbook.open(tmp_path) as book:
        book.start_subrun("3.00", "launch", {}, None, 0, plan("3.00", []), config())
        book.end_subrun("3.00", "restarting", 8, "rollback_skip")
        book.start_subrun("3.01", "loss_spike at step 7", {"incident": {"kind": "loss_spike", "onset_step": 7,
                                                                        "onset_sample": 48, "samples_per_step": 8}},
                          None, 4, plan("3.01", [[32, 56]]), config())
    out = io.StringIO()
    show_skipped(tmp_path, out, limit=2, chars=10_000)
    text = out.getvalue()
    assert "  from the incident's onset, #48 (step 7's batch):" in text
    assert list(shown_samples(text)) == [48, 49]
    everything = io.StringIO()
    show_skipped(tmp_path, everything, limit=24, chars=10_000)
    assert list(shown_samples(everything.getvalue())) == [*range(48, 56), *range(32, 48)]


def test_the_recorded_seed_picks_the_samples(tmp_path):
    write_run(tmp_path / "a", seed=SEED)
    write_run(tmp_path / "b", seed=SEED + 1)
    texts = []
    for run_dir in (tmp_path / "a", tmp_path / "b"):
        out = io.StringIO()
        show_skipped(run_dir, out, limit=1, chars=10_000)
        texts.append(shown_samples(out.getvalue())[40])
    assert texts[0] != texts[1]


def test_chars_cuts_each_sample(tmp_path):
    write_run(tmp_path)
    out = io.StringIO()
    show_skipped(tmp_path, out, limit=1, chars=12)
    line = next(line for line in out.getvalue().splitlines() if line.strip().startswith("#40 "))
    assert line.endswith("…") and len(line.split("  ")[-1]) <= 13


def test_control_characters_are_escaped():
    assert printable("a\x00b\x1b[0m\n\\x1b\t\u2028") == "a\\x00b\\x1b[0m\\n\\\\x1b\\t\\u2028"


def test_a_run_without_skips_says_so(tmp_path):
    with Logbook.open(tmp_path) as book:
        book.start_subrun("3.00", "launch", {}, None, 0, plan("3.00", []), config())
    out = io.StringIO()
    show_skipped(tmp_path, out)
    assert out.getvalue() == "tiny — run 3: no skip ranges: every sample of the stream was trained on " \
                             "(or is still to come)\n"


def test_a_logbook_without_a_config_is_one_clear_error(tmp_path):
    with Logbook.open(tmp_path) as book:
        book.start_subrun("3.00", "launch", {}, None, 0, plan("3.00", [[1, 2]]), {})
    with pytest.raises(LogbookError, match="recorded no data/model.seq_length/training.seed config"):
        show_skipped(tmp_path, io.StringIO())


def test_the_cli_prints_it(tmp_path, capsys):
    write_run(tmp_path)
    assert main(["logbook", "skipped", str(tmp_path), "--limit", "1", "--chars", "40"]) == 0
    printed = capsys.readouterr().out
    assert "samples [40, 52)" in printed and "#40" in printed and "#41" not in printed
    assert main(["logbook", "skipped", str(tmp_path), "--limit", "-1"]) == 2


def test_skipped_ranges_walks_the_lineage(tmp_path):
    write_run(tmp_path)
    with Logbook.open(tmp_path, create=False) as book:
        found = skipped_ranges(book.lineage())
    assert [(r.start, r.end, r.subrun.id, r.grows) for r in found] == [
        (40, 52, "3.01", ()), (40, 60, "3.02", ((40, 52),))]
