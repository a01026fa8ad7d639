"""The order in which Triton's core checks a request's inputs, so that when several fail, the error
names the one Triton names (qa ``L0_input_validation`` ``test_input_string_shape_validation``).

Triton keeps a request's inputs in a ``std::unordered_map<std::string, Input>``
(``InferenceRequest::original_inputs_``, filled in request order), and ``InferenceRequest::Normalize``
walks it for the datatype, shape, byte size and BYTES element checks. Its iteration order is that of
GCC's libstdc++ on Linux, reproduced here: the string hash (``_Hash_bytes``) and the bucket counts
the map grows through (``_Prime_rehash_policy``).
"""

from __future__ import annotations

from collections.abc import Sequence

# libstdc++'s std::hash<std::string> (``_Hash_bytes``, a MurmurHash2 variant, 64-bit) and the bucket
# counts its std::unordered_map takes as elements are added one by one (``_Prime_rehash_policy``)
_MASK64 = (1 << 64) - 1
_MUL = 0xC6A4A7935BD1E995
_SEED = 0xC70F6907
_BUCKET_COUNTS = (13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229, 172933, 351061)


def _std_hash(data: bytes) -> int:
    """libstdc++'s ``std::hash<std::string>`` of ``data`` on a 64-bit little-endian machine."""
    length = len(data)
    value = _SEED ^ (length * _MUL) & _MASK64
    aligned = length & ~7
    for start in range(0, aligned, 8):
        word = int.from_bytes(data[start:start + 8], "little") * _MUL & _MASK64
        value = (value ^ ((word ^ (word >> 47)) * _MUL & _MASK64)) * _MUL & _MASK64
    if length & 7:
        value = (value ^ int.from_bytes(data[aligned:], "little")) * _MUL & _MASK64
    value = (value ^ (value >> 47)) * _MUL & _MASK64
    return value ^ (value >> 47)


def triton_input_order(names: Sequence[str]) -> list[int]:
    """The order (indices into ``names``, distinct input names in request order) in which Triton's
    core checks a request's inputs: the iteration order of the ``std::unordered_map<std::string,
    Input>`` its ``InferenceRequest`` keeps them in (``original_inputs_``, filled in request order;
    ``InferenceRequest::Normalize`` walks it for the datatype, shape, byte size and BYTES element
    checks), as GCC's libstdc++ builds it on Linux x86-64 and aarch64. For two inputs it is the
    reverse of the request's order; for more it follows the names' hashes. Past 351,061 names the
    request's order."""
    count = len(names)
    if count > _BUCKET_COUNTS[-1]:
        return list(range(count))
    hashes = [_std_hash(name.encode()) for name in names]
    order: list[int] = []  # the map's one linked list; each bucket's nodes are contiguous in it
    buckets = 0
    for index in range(count):
        if index + 1 > buckets:  # a rehash: the nodes are moved over in list order
            buckets = next(size for size in _BUCKET_COUNTS if size >= index + 1)
            moved, order = order, []
            for node in moved:
                _insert(order, node, hashes, buckets)
        _insert(order, index, hashes, buckets)
    return order


def _insert(order: list[int], node: int, hashes: list[int], buckets: int) -> None:
    """Add ``node`` as libstdc++ does (``_M_insert_bucket_begin``): first in its bucket's run when the
    bucket holds nodes, else at the front of the list."""
    bucket = hashes[node] % buckets
    for position, other in enumerate(order):
        if hashes[other] % buckets == bucket:
            order.insert(position, node)
            return
    order.insert(0, node)
