"""Segments: sealed rows read back bit-exact; any damage to the file is reported as CorruptSegment."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from user_rl.cloud.buffer.segment import (
    HEADER_AREA,
    MAGIC,
    CorruptSegment,
    SegmentWriter,
    read_layout,
    read_segment,
    read_segment_into,
    seal_open_file,
    verify_segment,
)

SCHEMA = {
    "image": (np.uint8, (8, 8, 3)),
    "action": (np.float32, (4,)),
    "step": (np.int64, ()),
    "done": (np.bool_, ()),
}


def rows(start: int, n: int) -> dict[str, np.ndarray]:
    """Rows whose every column encodes the row's id, so misplaced bytes show up."""
    ids = np.arange(start, start + n)
    return {
        "image": (ids[:, None, None, None] * 7 + np.arange(192).reshape(8, 8, 3)).astype(np.uint8),
        "action": (ids[:, None] + np.arange(4) / 4).astype(np.float32),
        "step": ids.astype(np.int64),
        "done": ids % 3 == 0,
    }


def write_sealed(tmp_path: Path, chunk_sizes: tuple[int, ...] = (5, 7, 4), capacity: int = 32) -> Path:
    writer = SegmentWriter(tmp_path / "open-000001.seg", SCHEMA, capacity, meta={"robot": "arm0"})
    start = 0
    for n in chunk_sizes:
        writer.append(rows(start, n))
        start += n
    writer.seal(tmp_path / "000001.seg", meta={"first_step": 0})
    return tmp_path / "000001.seg"


def expect_corrupt(path: Path, *reasons: str) -> CorruptSegment:
    """Reading must fail with CorruptSegment (never another exception) naming the file."""
    with pytest.raises(CorruptSegment) as caught:
        read_segment(path)
    assert caught.value.reason in reasons, caught.value
    assert str(path) in str(caught.value)
    return caught.value


def test_round_trip_keeps_rows_meta_and_crcs(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path / "open-000007.seg", SCHEMA, capacity=20, meta={"robot": "arm0"})
    assert [writer.append(rows(0, 5)), writer.append(rows(5, 7)), writer.append(rows(12, 1))] == [
        (0, 5),
        (5, 12),
        (12, 13),
    ]
    assert (writer.rows, writer.capacity, writer.remaining) == (13, 20, 7)
    writer.sync()
    info = writer.seal(tmp_path / "000007.seg", meta={"episodes": [3, 4]})

    assert not (tmp_path / "open-000007.seg").exists()
    expected = rows(0, 13)
    assert info.rows == 13 and info.capacity == 20
    assert info.meta == {"robot": "arm0", "episodes": [3, 4]}
    assert info.data_bytes == sum(v.nbytes for v in expected.values())
    assert info.nbytes == (tmp_path / "000007.seg").stat().st_size
    assert info.column_crcs == {name: zlib.crc32(values) for name, values in expected.items()}

    segment = read_segment(tmp_path / "000007.seg")
    assert (segment.rows, segment.capacity, segment.meta) == (13, 20, info.meta)
    for name, values in expected.items():
        assert segment.columns[name].dtype == values.dtype
        np.testing.assert_array_equal(segment.columns[name], values)
        assert not segment.columns[name].flags.writeable
    loaded = segment.load()
    loaded["step"][0] = -1  # a RAM copy: changing it leaves the file alone
    assert read_segment(tmp_path / "000007.seg").columns["step"][0] == 0
    assert verify_segment(tmp_path / "000007.seg") is None


def test_columns_start_page_aligned_after_the_header(tmp_path: Path) -> None:
    layout = read_layout(write_sealed(tmp_path))
    offsets = [c["offset"] for c in layout["columns"]]
    assert offsets[0] == HEADER_AREA and all(o % 4096 == 0 for o in offsets) and offsets == sorted(offsets)


def test_empty_sealed_segment_reads_as_zero_rows(tmp_path: Path) -> None:
    segment = read_segment(write_sealed(tmp_path, chunk_sizes=()))
    assert segment.rows == 0 and segment.columns["image"].shape == (0, 8, 8, 3)


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda c: c.pop("action"), "action"),
        (lambda c: c.update(step=c["step"].astype(np.int32)), "step"),
        (lambda c: c.update(image=c["image"][:, :4]), "image"),
        (lambda c: c.update(done=c["done"][:2]), "done"),
        (lambda c: c.update(reward=np.zeros(3, np.float32)), "reward"),
        (lambda c: c.update(rows(0, 30)), "exceeds"),
    ],
)
def test_bad_append_is_refused_and_writes_nothing(tmp_path: Path, damage, match: str) -> None:
    writer = SegmentWriter(tmp_path / "open.seg", SCHEMA, capacity=32)
    writer.append(rows(0, 3))
    bad = rows(100, 3)
    damage(bad)
    with pytest.raises((KeyError, ValueError), match=match):
        writer.append(bad)
    assert writer.rows == 3
    writer.seal(tmp_path / "done.seg")
    image_offset = read_layout(tmp_path / "done.seg")["columns"][0]["offset"]
    with open(tmp_path / "done.seg", "rb") as file:  # the bad rows' bytes never reached the file
        file.seek(image_offset + 3 * 192)
        assert not any(file.read(29 * 192))
    np.testing.assert_array_equal(read_segment(tmp_path / "done.seg").columns["step"], [0, 1, 2])


def test_oversized_header_is_refused_before_creating_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="header"):
        SegmentWriter(tmp_path / "open.seg", SCHEMA, capacity=8, meta={"notes": "x" * HEADER_AREA})
    assert not (tmp_path / "open.seg").exists()


def test_abort_deletes_the_open_file(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path / "open.seg", SCHEMA, capacity=8)
    writer.append(rows(0, 2))
    writer.abort()
    assert not (tmp_path / "open.seg").exists()
    with pytest.raises(ValueError, match="closed"):
        writer.append(rows(0, 1))


def test_truncated_segment_is_corrupt(tmp_path: Path) -> None:
    sealed = write_sealed(tmp_path)
    data = sealed.read_bytes()
    cut_points = [0, 10, HEADER_AREA - 1, HEADER_AREA, len(data) - 1]
    cut_points += np.random.default_rng(0).integers(0, len(data), 12).tolist()
    for cut in cut_points:
        damaged = tmp_path / f"cut-{cut}.seg"
        damaged.write_bytes(data[:cut])
        error = expect_corrupt(damaged, "short" if cut < HEADER_AREA else "truncated")
        assert verify_segment(damaged).reason == error.reason
        with pytest.raises(CorruptSegment) as into_slot:
            read_segment_into(damaged, slot_arrays(32))
        assert into_slot.value.reason == error.reason


def slot_arrays(slot_rows: int, fill: int = 99) -> dict[str, np.ndarray]:
    """A RAM cache slot's column arrays (what the prefetcher reads a segment into), filled with a marker."""
    return {name: np.full((slot_rows, *shape), fill, dtype) for name, (dtype, shape) in SCHEMA.items()}


@pytest.mark.parametrize("capacity", [16, 32, 20_000], ids=["full", "half-full", "gaps-past-1MiB"])
def test_reading_into_a_cache_slot_gives_the_rows_of_the_maps(tmp_path: Path, capacity: int) -> None:
    """One gathered read fills each column's rows and nothing past them; a column of another dtype
    is converted; a column the slot lacks is skipped, yet checked."""
    sealed = write_sealed(tmp_path, (5, 7, 4), capacity)
    slot = slot_arrays(40)
    slot["action"] = np.full((40, 4), 99, np.float64)  # another dtype than stored: converted
    del slot["done"]  # not wanted
    n, present = read_segment_into(sealed, slot, verify=True)
    expected = read_segment(sealed).columns
    assert n == 16 and present == {"image", "action", "step"}
    for name, values in slot.items():
        np.testing.assert_array_equal(values[:16], expected[name])
        assert (values[16:] == 99).all(), f"{name}: rows past the segment's were written"
    entry = next(c for c in read_layout(sealed)["columns"] if c["name"] == "done")
    flip_byte(sealed, entry["offset"])
    with pytest.raises(CorruptSegment, match="'done'"):
        read_segment_into(sealed, slot_arrays(40))


def flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x5A
    path.write_bytes(bytes(data))


def test_flipped_header_byte_is_corrupt(tmp_path: Path) -> None:
    sealed = write_sealed(tmp_path)
    header_end = 16 + struct.unpack_from("<I", sealed.read_bytes(), 8)[0]
    original = sealed.read_bytes()
    for position in [0, 8, 12, 16, header_end - 1, *np.random.default_rng(1).integers(0, header_end, 10)]:
        sealed.write_bytes(original)
        flip_byte(sealed, int(position))
        expect_corrupt(sealed, "bad_magic", "header_crc", "bad_header")


@pytest.mark.parametrize("column", list(SCHEMA))
def test_flipped_data_byte_names_the_column(tmp_path: Path, column: str) -> None:
    sealed = write_sealed(tmp_path)
    entry = next(c for c in read_layout(sealed)["columns"] if c["name"] == column)
    used_bytes = 16 * rows(0, 1)[column].nbytes
    flip_byte(sealed, entry["offset"] + int(np.random.default_rng(2).integers(used_bytes)))
    error = expect_corrupt(sealed, "column_crc")
    assert repr(column) in str(error)
    with pytest.raises(CorruptSegment, match=repr(column)):  # the prefetcher's first load checks the same
        read_segment_into(sealed, slot_arrays(32))
    assert read_segment(sealed, verify=False).rows == 16  # a caller may still choose to look


def write_raw_header(path: Path, body: bytes, size: int = 4 * HEADER_AREA) -> None:
    """A file whose header crc is right but whose content may be nonsense."""
    path.write_bytes((struct.pack("<8sII", MAGIC, len(body), zlib.crc32(body)) + body).ljust(size, b"\0"))


GOOD_HEADER = {
    "format": 1,
    "sealed": True,
    "rows": 1,
    "capacity": 2,
    "meta": {},
    "columns": [{"name": "x", "dtype": "float32", "shape": [2], "offset": HEADER_AREA, "crc32": 0}],
}


@pytest.mark.parametrize(
    "edit",
    [
        lambda h: h.update(format=2),
        lambda h: h.update(rows=3),
        lambda h: h.update(rows=True),
        lambda h: h.update(meta=[]),
        lambda h: h.update(columns=[]),
        lambda h: h["columns"][0].update(dtype="object"),
        lambda h: h["columns"][0].update(dtype="no-such-type"),
        lambda h: h["columns"][0].update(shape=[-1]),
        lambda h: h["columns"][0].update(offset=100),
        lambda h: h["columns"][0].update(crc32=None),
        lambda h: h["columns"].append(dict(h["columns"][0], name="y")),  # overlapping regions
        lambda h: h.clear(),
    ],
)
def test_nonsense_header_is_bad_header(tmp_path: Path, edit) -> None:
    header = json.loads(json.dumps(GOOD_HEADER))
    edit(header)
    write_raw_header(tmp_path / "x.seg", json.dumps(header).encode())
    expect_corrupt(tmp_path / "x.seg", "bad_header")


def test_garbage_files_only_raise_corrupt_segment(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    write_raw_header(tmp_path / "json.seg", b"{not json")
    write_raw_header(tmp_path / "utf8.seg", b"\xff\xfe")
    write_raw_header(tmp_path / "deep.seg", b"[" * 10000)
    expect_corrupt(tmp_path / "json.seg", "bad_header")
    expect_corrupt(tmp_path / "utf8.seg", "bad_header")
    expect_corrupt(tmp_path / "deep.seg", "bad_header")
    for size in [0, 5, 100, HEADER_AREA, 3 * HEADER_AREA]:
        (tmp_path / "noise.seg").write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        expect_corrupt(tmp_path / "noise.seg", "short", "bad_magic")
    expect_corrupt(tmp_path / "absent.seg", "missing")


def test_open_segment_is_not_readable_as_sealed(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path / "open.seg", SCHEMA, capacity=8)
    writer.append(rows(0, 2))
    expect_corrupt(tmp_path / "open.seg", "not_sealed")
    assert read_layout(tmp_path / "open.seg")["sealed"] is False
    writer.abort()


CRASHING_WRITER = """
import os, signal, sys
sys.path[:0] = {path!r}
from test_cloud_segment import SCHEMA, rows
from user_rl.cloud.buffer.segment import SegmentWriter
writer = SegmentWriter({open_path!r}, SCHEMA, capacity=64, meta={{"robot": "arm0"}})
for start, n in [(0, 5), (5, 6), (11, 9)]:
    writer.append(rows(start, n))
os.kill(os.getpid(), signal.SIGKILL)  # crash: no seal, no close
"""


def test_crash_recovery_seals_the_durable_rows(tmp_path: Path) -> None:
    open_path = tmp_path / "open-000003.seg"
    here = str(Path(__file__).resolve().parent)
    script = CRASHING_WRITER.format(path=[here, *sys.path], open_path=str(open_path))
    crashed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert crashed.returncode == -9, crashed.stderr

    info = seal_open_file(open_path, 11, tmp_path / "000003.seg", meta={"recovered": True})  # 2 chunks logged
    assert not open_path.exists()
    assert info.rows == 11 and info.meta == {"robot": "arm0", "recovered": True}
    segment = read_segment(tmp_path / "000003.seg")
    assert segment.rows == 11
    for name, values in rows(0, 11).items():
        np.testing.assert_array_equal(segment.columns[name], values)


def test_recovery_of_a_damaged_open_file_is_corrupt(tmp_path: Path) -> None:
    (tmp_path / "open.seg").write_bytes(b"URLSEG01" + os.urandom(40))
    with pytest.raises(CorruptSegment) as caught:
        seal_open_file(tmp_path / "open.seg", 1, tmp_path / "sealed.seg")
    assert caught.value.reason == "short" and not (tmp_path / "sealed.seg").exists()
