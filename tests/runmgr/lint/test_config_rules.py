"""Each config rule fires on the mistake seeds 000/004 and OPT's lessons name,
with the values and the fix, and stays quiet on the fixed value; seed 000's
LLaMA2-70B as shipped (with its fixes) has no finding at all."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from runmgr.config.compose import load_run_config
from runmgr.config.lint import RULE_IDS
from runmgr.lint.config_rules import check_config, usual_lr
from runmgr.lint.rules import RULES
from runmgr.lint.run import lint_config

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def llama():
    return load_run_config("llama2_70b", [])


def with_(config, section: str, **values):
    return replace(config, **{section: replace(getattr(config, section), **values)})


CASES = [  # rule, (section, bad values), (section, fixed values), text the finding names
    ("adam-beta2", ("optim", {"adam_beta2": 0.999}), ("optim", {"adam_beta2": 0.95}), "optim.adam_beta2 is 0.999"),
    ("adam-eps", ("optim", {"adam_eps": 1e-5}), ("optim", {"adam_eps": 1e-8}), "optim.adam_eps is 1e-05"),
    ("dropout", ("model", {"hidden_dropout": 0.1}), ("model", {"hidden_dropout": 0.0}), "model.hidden_dropout=0.1"),
    ("dropout", ("model", {"attention_dropout": 0.1}), ("model", {"attention_dropout": 0.0}),
     "model.attention_dropout=0.1"),
    ("weight-decay-low", ("optim", {"weight_decay": 0.01}), ("optim", {"weight_decay": 0.1}),
     "optim.weight_decay is 0.01"),
    ("decay-1d", ("optim", {"decay_1d_weights": True}), ("optim", {"decay_1d_weights": False}),
     "optim.decay_1d_weights is true"),
    ("no-warmup", ("optim", {"lr_warmup_fraction": None, "lr_warmup_iters": 0}),
     ("optim", {"lr_warmup_fraction": None, "lr_warmup_iters": 2000}), "no learning-rate warmup"),
    ("no-warmup", ("optim", {"lr_warmup_fraction": 0.0}), ("optim", {"lr_warmup_fraction": 0.01}),
     "optim.lr_warmup_fraction=0.0"),
    ("peak-lr", ("optim", {"lr": 2e-2}), ("optim", {"lr": 1.5e-4}), "optim.lr is 0.02, 200x the usual 1.0e-04"),
    ("clip-off", ("optim", {"clip_grad": 0.0}), ("optim", {"clip_grad": 1.0}), "optim.clip_grad is 0"),
]


@pytest.mark.parametrize("rule, bad, fixed, named", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_rule_fires_on_the_mistake_and_not_on_the_fix(llama, rule, bad, fixed, named):
    found = check_config(with_(llama, bad[0], **bad[1]))
    assert [f.rule for f in found] == [rule]
    finding = found[0]
    assert named in finding.message
    assert finding.fix and finding.source == RULES[rule].source and finding.severity == RULES[rule].severity
    assert check_config(with_(llama, fixed[0], **fixed[1])) == []


def test_weight_decay_is_judged_low_only_with_bf16(llama):
    fp32 = with_(with_(llama, "optim", weight_decay=0.01), "precision", bf16=False)
    assert check_config(fp32) == []


def test_fp16_whose_loss_scale_can_never_drop_is_flagged_and_dynamic_scaling_is_not(llama):
    fp16 = with_(llama, "precision", bf16=False, fp16=True, initial_loss_scale=1024.0, min_loss_scale=1024.0)
    assert [f.rule for f in check_config(fp16)] == ["fp16-static-loss-scale"]
    assert check_config(with_(fp16, "precision", min_loss_scale=1.0)) == []


def test_the_peak_lr_scale_is_seed_000s():
    assert usual_lr(4 << 20) == pytest.approx(1e-4)
    assert usual_lr(1 << 20) == pytest.approx(1e-5)
    assert 1e-5 < usual_lr(2 << 20) < 1e-4
    assert usual_lr(16 * 128) is None  # a toy batch: the seed's scale is a 70B model's


def test_a_toy_batch_is_flagged_only_at_the_seeds_too_high_example(llama):
    toy = with_(with_(llama, "training", global_batch_size=16), "model", seq_length=128)
    assert check_config(with_(toy, "optim", lr=3e-3)) == []
    assert [f.rule for f in check_config(with_(toy, "optim", lr=2e-2))] == ["peak-lr"]


def test_llama2_70b_as_shipped_has_no_finding(llama):
    result = lint_config(llama)
    assert result.findings == () and result.silenced == ()


def test_every_id_the_config_accepts_has_a_check_that_makes_its_findings():
    """One table (runmgr/config/lint.py); each of its ids is raised by a check in runmgr/lint/."""
    checks = "".join(path.read_text() for path in (ROOT / "runmgr" / "lint").glob("*.py"))
    assert tuple(RULES) == RULE_IDS
    assert [rule for rule in RULE_IDS if f'RULES["{rule}"]' not in checks] == []
