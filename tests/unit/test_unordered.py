"""``frontend.validation.unordered``: libstdc++'s unordered_map order, checked against the
orders Triton 2.51 printed in its "Got input(s) [...]" messages."""

from __future__ import annotations

import pytest

from triton_mp.common.unordered import iteration_order, string_hash


@pytest.mark.parametrize(
    ("sent", "listed"),
    [
        (["INPUT0", "EXTRA"], ["EXTRA", "INPUT0"]),
        (["EXTRA", "INPUT0"], ["INPUT0", "EXTRA"]),
        (["X1", "X2"], ["X2", "X1"]),
        (["X1", "INPUT0", "X2"], ["INPUT0", "X2", "X1"]),
        (["INPUT0", "INPUT1", "EXTRA"], ["EXTRA", "INPUT1", "INPUT0"]),
        (["EXTRA", "INPUT0", "INPUT1"], ["INPUT1", "INPUT0", "EXTRA"]),
    ],
)
def test_the_order_triton_printed(sent: list[str], listed: list[str]) -> None:
    assert iteration_order(sent) == listed


def test_many_names_survive_rehashes_and_repeats() -> None:
    names = [f"in_{i}" for i in range(40)]
    order = iteration_order(names + names[:5])
    assert sorted(order) == sorted(names)
    assert order != names
    assert order != names[::-1]


def test_hash_is_64_bit_and_length_sensitive() -> None:
    assert 0 <= string_hash("INPUT0") < 1 << 64
    assert string_hash("") != string_hash("\\0")
    assert string_hash("abcdefgh") != string_hash("abcdefgh1")
