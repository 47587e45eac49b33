from logbook.configdiff import config_diff, flatten


def test_flatten_uses_dotted_keys_and_keeps_lists_whole():
    assert flatten({"optim": {"lr": 1e-3, "betas": [0.9, 0.95]}, "seed": 1}) == {
        "optim.lr": 1e-3, "optim.betas": [0.9, 0.95], "seed": 1}


def test_diff_shows_changed_added_and_removed_keys():
    old = {"optim": {"lr": 1e-3, "clip_grad": 1.0}, "data": {"seed": 1}}
    new = {"optim": {"lr": 5e-4, "clip_grad": 1.0}, "nodes": {"excluded": ["n3"]}}
    assert config_diff(old, new) == {
        "data.seed": [1, None],
        "nodes.excluded": [None, ["n3"]],
        "optim.lr": [1e-3, 5e-4],
    }


def test_equal_configs_have_no_diff_but_a_type_change_is_one():
    assert config_diff({"a": {"b": 1}}, {"a": {"b": 1}}) == {}
    assert config_diff({"flag": 1}, {"flag": True}) == {"flag": [1, True]}
