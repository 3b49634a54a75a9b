"""Serialised indexes load without rebuilding, and bad bytes raise ValueError instead of crashing."""

from __future__ import annotations

import pickle
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rhymerl.algorithms.drafting import HistoryIndex, IndexFormatError
from rhymerl.algorithms.drafting import _suffix_index as native

HEADER = native.HEADER_SIZE


def sample_index(seed: int = 0, n: int = 6, length: int = 80) -> HistoryIndex:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 20, size=length)
    hist = []
    for _ in range(n):
        seq = base.copy()
        flip = rng.random(length) < 0.1
        seq[flip] = rng.integers(0, 20, size=int(flip.sum()))
        hist.append((seq, float(rng.normal())))
    return HistoryIndex.build(hist, reward_weighted=True)


SMALL = sample_index(n=3, length=30).to_bytes()


def with_crc(data: bytearray) -> bytes:
    """Re-seal edited bytes with a valid checksum (to reach the structural checks)."""
    crc = zlib.crc32(bytes(data[HEADER:]), zlib.crc32(bytes(data[:36])))
    struct.pack_into("<I", data, 36, crc)
    return bytes(data)


def test_serialised_index_round_trips_and_drafts_identically() -> None:
    index = sample_index()
    data = index.to_bytes()
    loaded = HistoryIndex.from_bytes(data)
    assert loaded.to_bytes() == data
    assert loaded.stats() == index.stats()
    assert loaded.reward_weighted and loaded.n_responses == 6
    rng = np.random.default_rng(1)
    for _ in range(50):
        ctx = rng.integers(0, 20, size=int(rng.integers(0, 12)))
        assert loaded.draft(ctx, 8).tolist() == index.draft(ctx, 8).tolist()
    assert HistoryIndex.from_bytes(memoryview(data)).to_bytes() == data
    assert HistoryIndex.from_bytes(bytearray(data)).to_bytes() == data


def test_frequency_ranking_survives_serialisation() -> None:
    index = HistoryIndex.build([([1, 2, 3, 4], 1.0)], reward_weighted=False)
    assert not HistoryIndex.from_bytes(index.to_bytes()).reward_weighted


def test_header_has_magic_version_and_the_zlib_crc32() -> None:
    data = sample_index().to_bytes()
    magic, version, flags = struct.unpack_from("<8sII", data, 0)
    assert (magic, version, flags) == (b"RHYMEIDX", native.FORMAT_VERSION, 1)
    (crc,) = struct.unpack_from("<I", data, 36)
    assert crc == zlib.crc32(data[HEADER:], zlib.crc32(data[:36]))
    assert native.crc32(data) == zlib.crc32(data)


def test_pickling_goes_through_the_byte_format() -> None:
    index = sample_index()
    assert pickle.loads(pickle.dumps(index)).to_bytes() == index.to_bytes()


def test_every_truncation_raises_value_error() -> None:
    data = sample_index(n=2, length=20).to_bytes()
    for cut in range(len(data)):
        with pytest.raises(ValueError, match="truncated"):
            HistoryIndex.from_bytes(data[:cut])


def test_trailing_bytes_are_rejected() -> None:
    with pytest.raises(ValueError, match="trailing"):
        HistoryIndex.from_bytes(sample_index().to_bytes() + b"\0")


def test_bad_magic_and_unsupported_versions_are_named() -> None:
    data = bytearray(sample_index().to_bytes())
    with pytest.raises(IndexFormatError, match="magic"):
        HistoryIndex.from_bytes(b"NOTANIDX" + bytes(data[8:]))
    struct.pack_into("<I", data, 8, 99)
    with pytest.raises(ValueError, match="version 99"):
        HistoryIndex.from_bytes(bytes(data))
    with pytest.raises(ValueError):
        HistoryIndex.from_bytes(b"")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_random_corruption_raises_value_error(data: st.DataObject) -> None:
    raw = bytearray(SMALL)
    for pos in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=4, unique=True)):
        raw[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(ValueError):
        HistoryIndex.from_bytes(bytes(raw))



def _field_offsets(data: bytes) -> dict[str, int]:
    s, e = struct.unpack_from("<II", data, 28)
    offsets, pos = {}, HEADER
    for name, size in (("weight", 8 * s), ("count", 4 * s), ("len", 4 * s), ("link", 4 * s), ("best", 4 * s),
                       ("edge_begin", 4 * (s + 1)), ("edge_token", 4 * e), ("edge_target", 4 * e)):
        offsets[name] = pos
        pos += size
    assert pos == len(data)
    return offsets


@pytest.mark.parametrize(
    ("field", "index", "value", "message"),
    [
        ("link", 1, 0xFFFF_FFF0, "suffix link"),  # out of range
        ("link", 3, 3, "suffix link"),  # a self-loop: a fallback walk would never end
        ("link", 0, 0, "root"),
        ("len", 0, 5, "root"),
        ("len", 1, 10**6, "ordered by length"),
        ("edge_target", 0, 0xFFFF_FFF0, "edge target"),
        ("edge_target", 0, 0, "edge target"),  # pointing back to the root: a draft could cycle
        ("edge_begin", 1, 0xFFFF_FFF0, "edge"),
        ("best", 0, 0xFFFF_FFF0, "best edge"),
    ],
)
def test_structurally_invalid_bytes_with_a_valid_checksum_are_rejected(
    field: str, index: int, value: int, message: str
) -> None:
    data = bytearray(SMALL)
    struct.pack_into("<I", data, _field_offsets(SMALL)[field] + 4 * index, value)
    with pytest.raises(ValueError, match=message):
        HistoryIndex.from_bytes(with_crc(data))


def test_unsorted_edges_are_rejected() -> None:
    data = bytearray(SMALL)
    offs = _field_offsets(SMALL)
    s = struct.unpack_from("<I", SMALL, 28)[0]
    begins = struct.unpack_from(f"<{s + 1}I", SMALL, offs["edge_begin"])
    root_end = begins[1]
    assert root_end >= 2
    tokens = list(struct.unpack_from(f"<{root_end}i", SMALL, offs["edge_token"]))
    tokens[0], tokens[1] = tokens[1], tokens[0]
    struct.pack_into(f"<{root_end}i", data, offs["edge_token"], *tokens)
    with pytest.raises(ValueError, match="unsorted"):
        HistoryIndex.from_bytes(with_crc(data))
