"""The edge's disk spool on real files: round trip, cumulative acks, the bound, restarts, corruption."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from user_rl.edge.spool import Spool, SpoolCorrupt

EPOCH = 1_700_000_000_000_000_000  # a time_ns-sized stream epoch


def frames(i: int, n: int = 100) -> list[bytes | memoryview]:
    return [f"envelope {i}".encode(), memoryview(np.full(n, i, dtype=np.float32)).cast("B"), b""]


def batch_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_round_trip_keeps_frames_bytes_for_bytes(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20)
    obs = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    sent = [b"\x08\x01envelope", memoryview(obs), memoryview(np.zeros(0, np.uint8)), b"tail"]
    assert spool.put(EPOCH, 1, sent)
    got = spool.load(EPOCH, 1)
    assert all(isinstance(f, bytes) for f in got)
    assert got == [bytes(f) for f in sent]
    assert np.array_equal(np.frombuffer(got[1], np.float64).reshape(2, 3, 4), obs)
    assert batch_files(tmp_path) == [f"{EPOCH:020d}-{1:012d}.batch"]
    assert spool.bytes_used == (tmp_path / batch_files(tmp_path)[0]).stat().st_size
    with pytest.raises(KeyError):
        spool.load(EPOCH, 2)


def test_fsync_mode_writes_the_same_files(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, fsync=True)
    assert spool.put(EPOCH, 1, frames(1))
    assert spool.load(EPOCH, 1) == [bytes(f) for f in frames(1)]


def test_cumulative_ack_removes_exactly_the_prefix_of_one_epoch(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for seq in range(1, 6):
        spool.put(EPOCH, seq, frames(seq))
    for seq in range(1, 4):
        spool.put(EPOCH + 1, seq, frames(seq))
    size = spool.bytes_used // 8
    assert spool.ack_through(EPOCH, 3) == 3
    assert spool.pending(EPOCH) == [(EPOCH, 4), (EPOCH, 5)]
    assert spool.pending(EPOCH + 1) == [(EPOCH + 1, s) for s in (1, 2, 3)]
    assert spool.bytes_used == 5 * size and len(spool) == 5
    assert len(batch_files(tmp_path)) == 5
    assert spool.ack_through(EPOCH, 3) == 0  # a repeated ack is harmless
    assert spool.ack_through(EPOCH, 2) == 0  # so is a stale one
    assert spool.ack_through(EPOCH + 7, 99) == 0  # and one for an epoch we never had
    assert spool.first_pending(EPOCH) == 4
    assert spool.ack_through(EPOCH, 10) == 2
    assert spool.first_pending(EPOCH) is None
    assert spool.epochs() == [EPOCH + 1]
    assert spool.load(EPOCH + 1, 2) == [bytes(f) for f in frames(2)]


def test_pending_is_in_epoch_then_seq_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for epoch, seq in [(20, 2), (3, 10), (20, 1), (3, 9), (100, 1), (3, 11)]:
        spool.put(epoch, seq, frames(seq, n=4))
    assert spool.pending() == [(3, 9), (3, 10), (3, 11), (20, 1), (20, 2), (100, 1)]
    assert spool.epochs() == [3, 20, 100]
    assert spool.first_pending(20) == 1


def test_bound_refuses_without_writing_warns_once_and_recovers(tmp_path: Path, caplog) -> None:
    probe = Spool(tmp_path / "probe", max_bytes=1 << 20)
    probe.put(EPOCH, 1, frames(1))
    size = probe.bytes_used
    spool = Spool(tmp_path / "spool", max_bytes=3 * size + size // 2)
    assert all(spool.put(EPOCH, seq, frames(seq)) for seq in (1, 2, 3))
    caplog.set_level(logging.INFO, logger="user_rl.edge.spool")
    assert not spool.put(EPOCH, 4, frames(4))
    assert not spool.put(EPOCH, 4, frames(4))
    assert not spool.put(EPOCH, 4, frames(4))
    assert spool.refused == 3 and spool.full
    assert len(batch_files(tmp_path / "spool")) == 3 and len(spool) == 3
    assert spool.bytes_used == 3 * size
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "full" in message and str(tmp_path / "spool") in message
    assert f"{3 * size}/{3 * size + size // 2}" in message and "fleet.spool_max_mb" in message
    assert "dropped" in message

    caplog.clear()
    spool.ack_through(EPOCH, 1)
    assert spool.put(EPOCH, 4, frames(4))
    assert not spool.full
    assert any(r.levelno == logging.INFO and "room again" in r.getMessage() for r in caplog.records)
    assert spool.pending() == [(EPOCH, 2), (EPOCH, 3), (EPOCH, 4)]

    caplog.clear()  # filling up again is a new episode, worth a new warning
    assert not spool.put(EPOCH, 5, frames(5))
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_a_batch_bigger_than_the_whole_spool_is_refused(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=100)
    assert not spool.put(EPOCH, 1, [b"x" * 200])
    assert batch_files(tmp_path) == [] and spool.bytes_used == 0


def test_restart_sees_leftovers_in_order_and_can_load_them(tmp_path: Path, caplog) -> None:
    first = Spool(tmp_path, max_bytes=1 << 20)
    for seq in range(1, 5):
        first.put(EPOCH, seq, frames(seq))
    first.put(EPOCH + 5, 1, frames(9))
    first.ack_through(EPOCH, 1)
    del first  # the daemon crashes or restarts

    caplog.set_level(logging.INFO, logger="user_rl.edge.spool")
    again = Spool(tmp_path, max_bytes=1 << 20)
    assert again.recovered == 4 and len(again) == 4
    assert again.pending() == [(EPOCH, 2), (EPOCH, 3), (EPOCH, 4), (EPOCH + 5, 1)]
    assert again.bytes_used == sum(p.stat().st_size for p in tmp_path.iterdir())
    assert again.load(EPOCH, 3) == [bytes(f) for f in frames(3)]
    assert again.load(EPOCH + 5, 1) == [bytes(f) for f in frames(9)]
    assert any("recovered 4" in r.getMessage() for r in caplog.records)
    assert again.ack_through(EPOCH, 4) == 3


def corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[-10] ^= 0x01
    elif how == "truncate":
        del data[-7:]
    elif how == "magic":
        data[:4] = b"XXXX"
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how, reason", [("flip", "crc32"), ("truncate", "size"), ("magic", "magic")])
def test_corrupt_file_raises_on_load_and_other_batches_still_load(tmp_path: Path, how: str, reason: str) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for seq in (1, 2, 3):
        spool.put(EPOCH, seq, frames(seq))
    bad = spool.path(EPOCH, 2)
    corrupt(bad, how)
    with pytest.raises(SpoolCorrupt, match=reason) as info:
        spool.load(EPOCH, 2)
    assert isinstance(info.value, ValueError) and str(bad) in str(info.value)
    assert spool.load(EPOCH, 1) == [bytes(f) for f in frames(1)]
    assert spool.load(EPOCH, 3) == [bytes(f) for f in frames(3)]


def test_load_or_lost_marks_a_corrupt_batch_lost_and_keeps_it_until_acked(tmp_path: Path, caplog) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for seq in (1, 2):
        spool.put(EPOCH, seq, frames(seq))
    corrupt(spool.path(EPOCH, 1), "flip")
    with caplog.at_level(logging.WARNING, logger="user_rl.edge.spool"):
        assert spool.load_or_lost(EPOCH, 1) is None
        assert spool.load_or_lost(EPOCH, 1) is None  # asked again (a resend): counted and logged once
    told = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert len(told) == 1 and "crc32" in told[0]
    assert spool.lost_batches == 1 and spool.is_lost(EPOCH, 1)
    # The seq is still pending (the learner must hear of the gap) and its file is the tombstone.
    assert spool.pending() == [(EPOCH, 1), (EPOCH, 2)] and spool.path(EPOCH, 1).exists()
    assert spool.load_or_lost(EPOCH, 2) == [bytes(f) for f in frames(2)]
    assert spool.ack_through(EPOCH, 1) == 1  # the learner recorded the gap: now it goes
    assert not spool.path(EPOCH, 1).exists() and not spool.is_lost(EPOCH, 1)
    assert spool.bytes_used == spool.path(EPOCH, 2).stat().st_size


def test_a_batch_missing_from_the_spool_is_lost_not_a_crash(tmp_path: Path) -> None:
    """Found by reading the link: a gap ack made it reload a seq the spool had forgotten (KeyError)."""
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for seq in (1, 2, 3):
        spool.put(EPOCH, seq, frames(seq))
    spool.path(EPOCH, 2).unlink()  # deleted behind the spool's back
    assert spool.load_or_lost(EPOCH, 2) is None
    assert spool.load_or_lost(EPOCH, 7) is None  # never in the spool at all
    assert spool.lost_batches == 2 and spool.pending() == [(EPOCH, s) for s in (1, 2, 3, 7)]
    assert spool.ack_through(EPOCH, 7) == 4 and len(spool) == 0 and spool.bytes_used == 0


@pytest.mark.parametrize("how", ["flip", "truncate", "magic"])
def test_scan_marks_corrupt_leftovers_lost_with_a_warning(tmp_path: Path, caplog, how: str) -> None:
    first = Spool(tmp_path, max_bytes=1 << 20)
    for seq in (1, 2, 3):
        first.put(EPOCH, seq, frames(seq))
    corrupt(first.path(EPOCH, 2), how)
    with caplog.at_level(logging.WARNING, logger="user_rl.edge.spool"):
        again = Spool(tmp_path, max_bytes=1 << 20)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "corrupt" in warnings[0] and f"{2:012d}" in warnings[0]
    assert again.pending() == [(EPOCH, 1), (EPOCH, 2), (EPOCH, 3)] and again.recovered == 2
    assert again.is_lost(EPOCH, 2) and again.lost_batches == 1  # after a restart too, the gap is known
    assert again.load_or_lost(EPOCH, 2) is None and again.lost_batches == 1
    assert again.load(EPOCH, 3) == [bytes(f) for f in frames(3)]


def test_scan_rejects_a_file_whose_header_disagrees_with_its_name(tmp_path: Path) -> None:
    first = Spool(tmp_path, max_bytes=1 << 20)
    first.put(EPOCH, 1, frames(1))
    first.path(EPOCH, 1).rename(first.path(EPOCH, 7))
    again = Spool(tmp_path, max_bytes=1 << 20)
    assert again.pending() == [(EPOCH, 7)] and again.is_lost(EPOCH, 7) and again.recovered == 0


def test_temp_files_from_a_crash_mid_write_are_cleaned(tmp_path: Path) -> None:
    first = Spool(tmp_path, max_bytes=1 << 20)
    first.put(EPOCH, 1, frames(1))
    half = first.path(EPOCH, 2).with_name(first.path(EPOCH, 2).name + ".tmp")
    half.write_bytes(first.path(EPOCH, 1).read_bytes()[:20])  # the process died here
    (tmp_path / "README").write_text("not ours, left alone")
    again = Spool(tmp_path, max_bytes=1 << 20)
    assert not half.exists()
    assert again.pending() == [(EPOCH, 1)] and again.recovered == 1
    assert batch_files(tmp_path) == [f"{EPOCH:020d}-{1:012d}.batch", "README"]
    assert again.bytes_used == first.path(EPOCH, 1).stat().st_size
