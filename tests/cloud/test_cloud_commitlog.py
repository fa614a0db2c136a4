"""CommitLog: records read back in order; a torn or damaged tail loses only itself, and can be cut off."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from user_rl.cloud.buffer.commitlog import CommitLog

RECORDS = [b"segment=1 rows=5", b"x" * 3000, bytes(range(256)), b"last"]


def write_log(path: Path, records: list[bytes] = RECORDS) -> None:
    with CommitLog(path) as log:
        for record in records:
            log.append(record)
        log.sync()
        assert log.size == path.stat().st_size


def test_records_round_trip_and_reopening_appends(tmp_path: Path) -> None:
    path = tmp_path / "commits.log"
    write_log(path)
    assert CommitLog.read(path) == (RECORDS, 0)
    write_log(path, [b"after reopen"])
    assert CommitLog.read(path) == (RECORDS + [b"after reopen"], 0)


def test_missing_log_reads_empty(tmp_path: Path) -> None:
    assert CommitLog.read(tmp_path / "absent.log") == ([], 0)


def test_empty_record_is_refused(tmp_path: Path) -> None:
    with CommitLog(tmp_path / "commits.log") as log, pytest.raises(ValueError, match="payload"):
        log.append(b"")


def cut_mid_payload(data: bytes) -> bytes:
    return data[:-2]


def cut_mid_frame(data: bytes) -> bytes:
    return data[: -(len(RECORDS[-1]) + 5)]


def flip_last_payload_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


def append_garbage(data: bytes) -> bytes:
    return data + b"\x07\x00\x00\x00garbage!"


def append_zeros(data: bytes) -> bytes:  # what a file system may leave after a crash
    return data + bytes(4096)


@pytest.mark.parametrize(
    "damage, survivors",
    [
        (cut_mid_payload, RECORDS[:-1]),
        (cut_mid_frame, RECORDS[:-1]),
        (flip_last_payload_byte, RECORDS[:-1]),
        (append_garbage, RECORDS),
        (append_zeros, RECORDS),
    ],
)
def test_torn_tail_keeps_earlier_records(
    tmp_path: Path, damage: Callable[[bytes], bytes], survivors: list[bytes]
) -> None:
    path = tmp_path / "commits.log"
    write_log(path)
    path.write_bytes(damage(path.read_bytes()))
    damaged_size = path.stat().st_size

    records, dropped = CommitLog.read(path)
    assert records == survivors and dropped > 0
    assert path.stat().st_size == damaged_size  # reading alone changes nothing

    assert CommitLog.read(path, truncate_torn_tail=True) == (survivors, dropped)
    assert path.stat().st_size == damaged_size - dropped
    assert CommitLog.read(path) == (survivors, 0)
    write_log(path, [b"next commit"])
    assert CommitLog.read(path) == (survivors + [b"next commit"], 0)


def test_reopening_a_torn_log_cuts_the_tail_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "commits.log"
    write_log(path)
    path.write_bytes(cut_mid_payload(path.read_bytes()))
    with CommitLog(path) as log:
        assert log.dropped_bytes > 0
        log.append(b"next commit")
    assert CommitLog.read(path) == (RECORDS[:-1] + [b"next commit"], 0)
