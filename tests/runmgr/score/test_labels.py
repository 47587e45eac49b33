"""A labels file says what happened in a log; a wrong one is one line naming the file and the key."""

from __future__ import annotations

import pytest

from runmgr.score.labels import DEFAULT_WITHIN, ScoreInputError, read_labels

GOOD = """\
about: a persistent spike and a hang
flavor: mindspeed_llm
silence_at_end_s: 1800
incidents:
  - {class: spike_persistent, kinds: [loss_spike, grad_spike], step: 1200, remedy: [rollback_skip]}
  - {class: hang, kinds: [hang], step: 2400, remedy: [dump_and_restart, restart], within: 5}
"""


def test_a_labels_file_is_read_into_typed_labels(tmp_path):
    path = tmp_path / "job.labels.yaml"
    path.write_text(GOOD)
    labels = read_labels(path)
    assert labels.flavor == "mindspeed_llm" and labels.silence_at_end_s == 1800.0 and not labels.clean
    spike, hang = labels.incidents
    assert spike.kinds == ("loss_spike", "grad_spike") and spike.within == DEFAULT_WITHIN
    assert hang.remedy == ("dump_and_restart", "restart") and hang.within == 5
    assert spike.explains("grad_spike", 1190) and spike.explains("loss_spike", 1200 + DEFAULT_WITHIN)
    assert not spike.explains("loss_spike", 1000) and not spike.explains("hang", 1200)


@pytest.mark.parametrize("text, words", [
    (GOOD.replace("flavor: mindspeed_llm", "flavour: mindspeed_llm"), "unknown key flavour"),
    (GOOD.replace("flavor: mindspeed_llm\n", ""), "missing flavor"),
    (GOOD.replace("mindspeed_llm", "deepspeed"), "flavor 'deepspeed' is not one of megatron_lm, mindspeed_llm"),
    (GOOD.replace("kinds: [hang]", "kinds: [stall]"), "incidents[1].kinds 'stall' is not one of"),
    (GOOD.replace("remedy: [rollback_skip]", "remedy: [rollback]"), "incidents[0].remedy 'rollback' is not one of"),
    (GOOD.replace("step: 1200", "step: -3"), "incidents[0].step must be a whole number >= 0"),
    (GOOD.replace(", within: 5", ", when: 5"), "unknown key incidents[1].when"),
    (GOOD.replace("remedy: [rollback_skip]", "remedy: []"), "incidents[0].remedy must be a non-empty list"),
    (GOOD.replace("1800", "soon"), "silence_at_end_s must be seconds >= 0"),
    ("incidents: [", "is not YAML"),
    ("- a list", "expected a mapping"),
])
def test_a_wrong_labels_file_is_one_line_naming_it(tmp_path, text, words):
    path = tmp_path / "job.labels.yaml"
    path.write_text(text)
    with pytest.raises(ScoreInputError) as refused:
        read_labels(path)
    message = str(refused.value)
    assert str(path) in message and words in message and "\n" not in message, message
