"""Seed 004's pinned configuration: what the protocol sets, and the overrides it refuses."""

from __future__ import annotations

import pytest

from runmgr.errors import UserError
from runmgr.precision.protocol import Side, pinned_config, side_from_items


def test_both_sides_get_seed_004s_simplified_configuration():
    config = pinned_config(Side("demo"), 10, None)
    m, o, t = config.model, config.optim, config.training
    assert m.num_layers == 2 and m.hidden_dropout == 0 and m.attention_dropout == 0
    assert o.lr_decay_style == "constant" and o.lr_warmup_iters == 0 and o.lr_warmup_fraction is None
    assert t.deterministic and t.train_iters == 10 and config.checkpoint.save is None


def test_the_other_side_runs_with_the_references_seed():
    reference = pinned_config(Side("demo", ("training.seed=77",)), 5, None)
    other = pinned_config(Side("demo"), 5, None, seed=reference.training.seed)
    assert reference.training.seed == other.training.seed == 77


def test_an_override_that_says_what_the_pin_says_is_accepted():
    assert pinned_config(Side("demo", ("model.num_layers=2",)), 3, None).model.num_layers == 2


@pytest.mark.parametrize("override, is_reference, says", [
    ("model.num_layers=4", True, "pins model.num_layers=2"),
    ("optim.lr_decay_style=cosine", False, "pins optim.lr_decay_style=constant"),
    ("training.deterministic=false", True, "pins training.deterministic=true"),
    ("training.train_iters=50", True, "use --steps N"),
    ("chaos=kill_worker", True, "injects no faults"),
    ("trainer.kind=megatron", True, "--against-log FILE"),
    ("training.seed=5", False, "set training.seed on the first config instead"),
])
def test_an_override_the_protocol_would_overrule_is_refused_with_one_line(override, is_reference, says):
    with pytest.raises(UserError, match=says) as caught:
        pinned_config(Side("demo", (override,)), 3, None, seed=None if is_reference else 1234)
    assert "\n" not in str(caught.value) and override in str(caught.value)


@pytest.mark.parametrize("items", [[], ["conf=demo", "conf=run12"], ["conf="], ["model.num_layers=2"]])
def test_each_side_names_exactly_one_config(items):
    with pytest.raises(UserError, match="must name exactly one config"):
        side_from_items(items, "--against")


def test_a_side_keeps_its_overrides_in_order():
    side = side_from_items(["optim.lr=1e-3", "conf=demo", "precision.embedding_bf16=true"], "the reference")
    assert side == Side("demo", ("optim.lr=1e-3", "precision.embedding_bf16=true"))
    assert side.label() == "conf=demo optim.lr=1e-3 precision.embedding_bf16=true"
