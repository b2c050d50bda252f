"""The order in which Triton lists a request's inputs in its messages.

Imported by ``common.input_checks``. Triton keeps a request's inputs in a
``std::unordered_map<std::string, Input>`` (core ``infer_request.h``
``original_inputs_``) and its "expected N inputs but got M inputs ... Got input(s) [...]"
message walks that map, so the names come in libstdc++'s iteration order, not the order the
client sent them. ``iteration_order`` replays libstdc++'s hashtable (``std::hash`` of a
string is ``_Hash_bytes`` with seed 0xc70f6907, prime rehash policy, max load factor 1.0,
each new node at the front of its bucket) so our message lists them as Triton does.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

_MASK = (1 << 64) - 1
_MUL = (0xC6A4A793 << 32) + 0x5BD1E995
_SEED = 0xC70F6907
_FAST_BUCKETS = (2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13)
"""libstdc++ ``_Prime_rehash_policy::_M_next_bkt``'s table for fewer than 14 buckets."""
_PRIMES = (
    13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 103, 109,
    113, 127, 137, 139, 149, 157, 167, 179, 193, 199, 211, 227, 241, 257, 277, 293, 313,
    337, 359, 383, 409, 439, 467, 503, 541, 577, 619, 661, 709, 761, 823, 887, 953, 1031,
)  # fmt: skip
"""The start of libstdc++'s ``__prime_list`` (enough for any model's inputs)."""


def _shift_mix(v: int) -> int:
    return v ^ (v >> 47)


def string_hash(text: str) -> int:
    """``std::hash<std::string>`` of ``text``'s UTF-8 bytes on 64-bit libstdc++
    (``_Hash_bytes``, a MurmurHash64A variant)."""
    data = text.encode()
    aligned = len(data) & ~7
    h = _SEED ^ ((len(data) * _MUL) & _MASK)
    for i in range(0, aligned, 8):
        word = int.from_bytes(data[i : i + 8], "little")
        h = ((h ^ ((_shift_mix((word * _MUL) & _MASK) * _MUL) & _MASK)) * _MUL) & _MASK
    if len(data) & 7:
        h = ((h ^ int.from_bytes(data[aligned:], "little")) * _MUL) & _MASK
    h = (_shift_mix(h) * _MUL) & _MASK
    return _shift_mix(h)


def _next_buckets(n: int) -> int:
    if n < len(_FAST_BUCKETS):
        return 1 if n == 0 else _FAST_BUCKETS[n]
    return _PRIMES[min(bisect_left(_PRIMES, n), len(_PRIMES) - 1)]


def iteration_order(names: Iterable[str]) -> list[str]:
    """The distinct ``names``, inserted in order into a default ``std::unordered_map``,
    in the order iterating the map yields them."""
    nodes: list[tuple[str, int]] = []  # the singly linked list, first node first
    n_buckets, next_resize = 1, 0
    for name in names:
        if any(key == name for key, _ in nodes):
            continue  # NOTE: emplace of an existing key inserts nothing
        code = string_hash(name)
        if len(nodes) + 1 > next_resize:
            # NOTE: _M_need_rehash: the first insert asks for at least 11 buckets.
            least = max(len(nodes) + 1, 0 if next_resize else 11)
            if least >= n_buckets:
                n_buckets = _next_buckets(max(least + 1, n_buckets * 2))
                next_resize = n_buckets
                nodes = _rehash(nodes, n_buckets)
            else:
                next_resize = n_buckets
        nodes = _insert(nodes, (name, code), n_buckets)
    return [key for key, _ in nodes]


def _insert(nodes: list[tuple[str, int]], node: tuple[str, int], n: int) -> list[tuple[str, int]]:
    """``_M_insert_bucket_begin``: before the first node of its bucket, else at the front."""
    bucket = node[1] % n
    for i, (_, code) in enumerate(nodes):
        if code % n == bucket:
            return [*nodes[:i], node, *nodes[i:]]
    return [node, *nodes]


def _rehash(nodes: list[tuple[str, int]], n: int) -> list[tuple[str, int]]:
    """``_M_rehash_aux`` (unique keys): each node, in list order, goes to the front of the
    list when its new bucket is empty, else right after its bucket's first node."""
    out: list[tuple[str, int]] = []
    for node in nodes:
        bucket = node[1] % n
        first = next((i for i, (_, c) in enumerate(out) if c % n == bucket), None)
        if first is None:
            out.insert(0, node)
        else:
            out.insert(first + 1, node)
    return out
