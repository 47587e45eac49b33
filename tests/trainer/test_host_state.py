"""A rank's state as one block of host memory (trainer/host_state.py): copied whole and exact,
the previous copy's memory reused, and a peer's bytes read as plain data only."""

from __future__ import annotations

import io

import pytest
import torch

from trainer import host_state


def state(scale: float = 1.0) -> dict:
    return {"model": {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3) * scale,
                      "e": torch.ones(5, dtype=torch.bfloat16) * scale},
            "optimizer": {"state": {0: {"step": torch.tensor(7.0), "exp_avg": torch.full((3,), scale)}},
                          "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0]}]},
            "cursor": 42, "ids": torch.tensor([1, 2, 3], dtype=torch.int64)}


def assert_same(one, other) -> None:
    if isinstance(one, torch.Tensor):
        assert one.dtype == other.dtype and one.shape == other.shape and torch.equal(one, other)
    elif isinstance(one, dict):
        assert one.keys() == other.keys()
        for key in one:
            assert_same(one[key], other[key])
    elif isinstance(one, (list, tuple)):
        assert type(one) is type(other) and len(one) == len(other)
        for a, b in zip(one, other):
            assert_same(a, b)
    else:
        assert one == other


def test_a_copy_holds_every_tensor_and_value_exactly_and_is_not_aliased():
    original = state()
    kept = host_state.take(original)
    original["model"]["w"].add_(1.0)  # the copy does not follow the live tensor
    restored = kept.unpack()
    assert_same(restored, state())
    restored["model"]["w"].zero_()  # nor does the kept copy follow what was restored from it
    assert_same(kept.unpack(), state())


def test_the_next_copy_reuses_the_memory_of_one_with_the_same_shapes():
    first = host_state.take(state())
    second = host_state.take(state(2.0), reuse=first)
    assert second.buffer.data_ptr() == first.buffer.data_ptr()
    assert_same(second.unpack(), state(2.0))
    other = state()
    other["model"]["w"] = torch.zeros(4)
    third = host_state.take(other, reuse=second)
    assert third.buffer.data_ptr() != second.buffer.data_ptr()
    assert_same(third.unpack(), other)


def test_the_parts_are_copied_in_order_so_a_copy_can_be_stopped_between_them():
    seen = []
    host_state.take(state(), copy=lambda part, destinations, sources: seen.append((part, len(sources))))
    assert seen == [("model", 2), ("optimizer", 2), ("cursor", 0), ("ids", 1)]


class Payload:
    def __reduce__(self):
        return (print, ("not data",))


def test_a_peer_s_bytes_that_are_not_plain_data_are_refused():
    buffer = io.BytesIO()
    torch.save({"skeleton": Payload(), "slots": [], "extra": None}, buffer)
    payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    with pytest.raises(ValueError, match="not plain data"):
        host_state._decode(payload, torch.empty(0, dtype=torch.uint8))
    # What a peer sends for real reads back whole.
    kept = host_state.take(state())
    decoded, extra = host_state._decode(host_state._encode(kept, {"losses": [1.5]}), kept.buffer.clone())
    assert extra == {"losses": [1.5]}
    assert_same(decoded.unpack(), state())
