"""``lint.ignore`` silences a rule on purpose and says so; an id that names no
rule is refused with one line when the config is composed."""

from __future__ import annotations

import pytest

from runmgr.config.compose import load_run_config
from runmgr.errors import ConfigError
from runmgr.lint.run import lint_config


def test_an_ignored_rule_is_silenced_and_kept_for_the_logbook():
    config = load_run_config("llama2_70b", ["model.hidden_dropout=0.1", "optim.adam_beta2=0.999",
                                            "lint.ignore=[dropout,clip-off]"])
    result = lint_config(config)
    assert [f.rule for f in result.findings] == ["adam-beta2"]
    assert [f.rule for f in result.silenced] == ["dropout"]
    evidence = result.evidence()
    assert [w["rule"] for w in evidence["warnings"]] == ["adam-beta2"]
    assert [(e["rule"], e["silenced"] is not None) for e in evidence["ignored"]] == [("dropout", True),
                                                                                      ("clip-off", False)]


def test_an_unknown_rule_id_is_refused_in_one_line_naming_the_ids():
    with pytest.raises(ConfigError) as refused:
        load_run_config("llama2_70b", ["lint.ignore=[dropot]"])
    message = str(refused.value)
    assert "\n" not in message and "dropot" in message and "dropout" in message


def test_run12_silences_the_dropout_it_reproduces_on_purpose():
    result = lint_config(load_run_config("run12", []))
    assert result.findings == ()
    assert [f.rule for f in result.silenced] == ["dropout"]
