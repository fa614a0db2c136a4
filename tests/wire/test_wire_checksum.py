"""The spool's and the segments' checksum is zlib's CRC-32, whichever library computes it: a file
written where python-isal is installed checks where it is not, and the other way round."""

from __future__ import annotations

import zlib

import numpy as np

from user_rl.wire.checksum import crc32


def test_the_checksum_is_zlibs_crc32_chained_over_pieces() -> None:
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 3 << 20, dtype=np.uint8)  # big enough for the vectorised paths
    assert crc32(data) == zlib.crc32(data)
    assert crc32(b"") == zlib.crc32(b"") == 0
    chained = 0
    for piece in np.array_split(data, [1, 100, 70_000, 2 << 20]):  # odd sizes: every tail path
        chained = crc32(piece, chained)
    assert chained == zlib.crc32(data)
    assert crc32(memoryview(data)[5:1000], 12345) == zlib.crc32(memoryview(data)[5:1000], 12345)
