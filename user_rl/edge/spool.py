"""The edge's disk spool: batches wait here until the learner acknowledges them.

A batch must outlive a learner outage, a dropped link and a restart of the daemon, so each
one is a file, written to a temp name and renamed. The learner acks cumulatively per stream
epoch, so `ack_through` drops a prefix of one epoch; an in-memory sorted index keeps that
cheap. The spool is bounded: a refused `put` makes the caller drop the batch *before* it
gets a seq, so the stream never has a hole that can never be filled.

A batch whose file cannot be read back (a flipped bit, a torn write after a power cut) is
*lost*, never silently forgotten: its file stays as a tombstone until the learner has
acknowledged the seq, so even after a restart the link knows to send an explicit gap for it
and the stream moves past it.

File layout (little-endian): magic, epoch, seq, frame count, each frame's length, then a
crc32 over all of that and the frames, then the frames concatenated.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path

from user_rl.wire.checksum import crc32

log = logging.getLogger(__name__)

MAGIC = b"URS1"
_HEAD = struct.Struct("<4sqqI")  # magic, epoch, seq, frame count
_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")
MAX_FRAMES = 1 << 16  # a corrupt count must not make us allocate a huge length table
_NAME = re.compile(r"^(\d{20})-(\d{12})\.batch$")
_TMP_SUFFIX = ".tmp"
RESERVED_BYTES = 4096  # a reserved put (an epoch's end marker) may go past the bound by at most this
_IOV_MAX = 1024  # buffers one writev takes (Linux's IOV_MAX)


class SpoolCorrupt(ValueError):
    """A spooled batch cannot be trusted; the file and the reason say why."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"spool file {path} is corrupt: {reason}")
        self.path = path
        self.reason = reason


def _file_name(epoch: int, seq: int) -> str:
    return f"{epoch:020d}-{seq:012d}.batch"


def _header(epoch: int, seq: int, lengths: Sequence[int]) -> bytes:
    return _HEAD.pack(MAGIC, epoch, seq, len(lengths)) + struct.pack(f"<{len(lengths)}Q", *lengths)


def _write_all(fd: int, views: list[memoryview]) -> None:
    """Write the buffers one after the other with as few `writev` calls as IOV_MAX allows (one for
    a batch: a write per frame costs a syscall each), going on after a short write."""
    views = [v for v in views if v.nbytes]
    while views:
        done = os.writev(fd, views[:_IOV_MAX])
        while views and done >= views[0].nbytes:
            done -= views[0].nbytes
            views.pop(0)
        if done:
            views[0] = views[0][done:]


class Spool:
    """Unacknowledged batches on disk, keyed by (epoch, seq), bounded by `max_bytes`.

    `fsync=True` makes a stored batch survive a power cut (set it on a real robot); the
    default only survives a crash of the process, which is enough for sims.
    """

    def __init__(self, directory: str | Path, max_bytes: int, fsync: bool = False) -> None:
        if max_bytes <= 0:
            raise ValueError(f"spool max_bytes must be positive, got {max_bytes}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._dir = str(self.directory)
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.refused = 0
        self.recovered = 0
        self.bytes_used = 0
        self._full = False
        self._dropped_while_full = 0
        self._seqs: dict[int, list[int]] = {}
        self._sizes: dict[tuple[int, int], int] = {}
        self._lost: set[tuple[int, int]] = set()  # unreadable batches, kept until acked
        self.lost_batches = 0  # batches found unreadable since this spool was opened
        self._scan()

    def __len__(self) -> int:
        return len(self._sizes)

    @property
    def full(self) -> bool:
        """True from a refused put until the next put that fits."""
        return self._full

    def epochs(self) -> list[int]:
        return sorted(self._seqs)

    def pending(self, epoch: int | None = None) -> list[tuple[int, int]]:
        """What the learner has not acknowledged yet, in send order."""
        epochs = self.epochs() if epoch is None else [epoch]
        return [(e, s) for e in epochs for s in self._seqs.get(e, ())]

    def first_pending(self, epoch: int) -> int | None:
        seqs = self._seqs.get(epoch)
        return seqs[0] if seqs else None

    def last_pending(self, epoch: int) -> int | None:
        seqs = self._seqs.get(epoch)
        return seqs[-1] if seqs else None

    def path(self, epoch: int, seq: int) -> Path:
        return self.directory / _file_name(epoch, seq)

    def _index(self, epoch: int, seq: int, size: int) -> None:
        old = self._sizes.get((epoch, seq))
        if old is None:
            seqs = self._seqs.setdefault(epoch, [])
            if not seqs or seq > seqs[-1]:
                seqs.append(seq)  # the usual case: seqs arrive in order
            else:
                bisect.insort(seqs, seq)
        self.bytes_used += size - (old or 0)
        self._sizes[(epoch, seq)] = size

    def put(self, epoch: int, seq: int, frames: Sequence[bytes | memoryview], reserve: bool = False) -> bool:
        """Store a batch; False (nothing written) when it would push the spool past its bound.

        `reserve`: a marker of a few hundred bytes that must be stored even in a full spool (the end
        of a dead life's epoch); it may go past the bound by that much."""
        if epoch < 0 or seq < 0:
            raise ValueError(f"epoch and seq must be non-negative, got ({epoch}, {seq})")
        views = [memoryview(f).cast("B") for f in frames]
        header = _header(epoch, seq, [v.nbytes for v in views])
        size = len(header) + _CRC.size + sum(v.nbytes for v in views)
        replaced = self._sizes.get((epoch, seq), 0)
        if self.bytes_used - replaced + size > self.max_bytes and not (reserve and size <= RESERVED_BYTES):
            self._refuse(size)
            return False
        crc = crc32(header)
        for v in views:
            crc = crc32(v, crc)
        final = os.path.join(self._dir, _file_name(epoch, seq))  # str paths: pathlib costs more than the write
        tmp = final + _TMP_SUFFIX
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # as open(): the umask decides
            try:
                _write_all(fd, [memoryview(header), memoryview(_CRC.pack(crc)), *views])
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        if self.fsync:
            self._fsync_dir()  # makes the rename itself durable
        self._index(epoch, seq, size)
        if self._full:
            self._full = False
            log.info(
                "edge spool at %s has room again (%d/%d bytes); %d batches were dropped while it was full",
                self.directory,
                self.bytes_used,
                self.max_bytes,
                self._dropped_while_full,
            )
        return True

    def _refuse(self, size: int) -> None:
        self.refused += 1
        if self._full:
            self._dropped_while_full += 1
            return
        self._full = True
        self._dropped_while_full = 1
        log.warning(
            "edge spool at %s is full (%d/%d bytes, next batch %d bytes): new transitions are being "
            "dropped until the learner acknowledges what is spooled. Check the link to the learner; "
            "to keep more, raise fleet.spool_max_mb in the config.",
            self.directory,
            self.bytes_used,
            self.max_bytes,
            size,
        )

    def ack_through(self, epoch: int, seq: int) -> int:
        """The learner has everything of `epoch` up to `seq`: delete those files; return how many."""
        seqs = self._seqs.get(epoch)
        if not seqs:
            return 0
        cut = bisect.bisect_right(seqs, seq)
        for s in seqs[:cut]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self._dir, _file_name(epoch, s)))
            self.bytes_used -= self._sizes.pop((epoch, s))
            self._lost.discard((epoch, s))
        del seqs[:cut]  # one slice, not `cut` deletes from the front
        if not seqs:
            del self._seqs[epoch]
        return cut

    def load(self, epoch: int, seq: int) -> list[bytes]:
        """The frames as stored; `SpoolCorrupt` when the file cannot be trusted."""
        if (epoch, seq) not in self._sizes:
            raise KeyError(f"({epoch}, {seq}) is not in the spool at {self.directory}")
        return self._read(self.path(epoch, seq), epoch, seq)

    def is_lost(self, epoch: int, seq: int) -> bool:
        return (epoch, seq) in self._lost

    def load_or_lost(self, epoch: int, seq: int) -> list[memoryview] | None:
        """Like `load`, but a batch that cannot be read (corrupt, missing) is marked lost and None
        comes back: the caller sends an explicit gap for it. Its file stays until `ack_through`.
        The frames are views into the one buffer the file was read into (the link sends them
        without a copy; copying each frame out again cost as much as reading the file)."""
        if (epoch, seq) in self._lost:
            return None
        try:
            if (epoch, seq) not in self._sizes:
                raise KeyError(f"({epoch}, {seq}) is not in the spool at {self.directory}")
            return self._read(self.path(epoch, seq), epoch, seq, copy=False)
        except (SpoolCorrupt, KeyError, OSError) as exc:
            reason = exc if isinstance(exc, SpoolCorrupt) else f"batch ({epoch}, {seq}) cannot be read: {exc}"
            log.warning("%s; the learner will be told this batch is lost", reason)
            self._mark_lost(epoch, seq)
            return None

    def _mark_lost(self, epoch: int, seq: int) -> None:
        if (epoch, seq) not in self._sizes:  # gone without a trace: remember the seq itself
            self._index(epoch, seq, 0)
        self._lost.add((epoch, seq))
        self.lost_batches += 1

    def _read(self, path: Path, epoch: int, seq: int, copy: bool = True) -> list:
        """The frames of a batch file, checked; each as bytes, or (`copy=False`) as a view."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise SpoolCorrupt(path, "file is missing") from None
        if len(data) < _HEAD.size:
            raise SpoolCorrupt(path, f"cut short: {len(data)} bytes, header alone is {_HEAD.size}")
        magic, f_epoch, f_seq, count = _HEAD.unpack_from(data)
        if magic != MAGIC:
            raise SpoolCorrupt(path, f"bad magic {magic!r}, expected {MAGIC!r}")
        if (f_epoch, f_seq) != (epoch, seq):
            raise SpoolCorrupt(path, f"header says ({f_epoch}, {f_seq}), name says ({epoch}, {seq})")
        if count > MAX_FRAMES:
            raise SpoolCorrupt(path, f"frame count {count} exceeds {MAX_FRAMES}")
        body = _HEAD.size + count * _LEN.size + _CRC.size
        if len(data) < body:
            raise SpoolCorrupt(path, f"cut short in the header: {len(data)} of {body} bytes")
        lengths = [_LEN.unpack_from(data, _HEAD.size + i * _LEN.size)[0] for i in range(count)]
        if len(data) != body + sum(lengths):
            raise SpoolCorrupt(path, f"size {len(data)} bytes, header promises {body + sum(lengths)}")
        (crc,) = _CRC.unpack_from(data, body - _CRC.size)
        view = memoryview(data)
        actual = crc32(view[body:], crc32(view[: body - _CRC.size]))
        if actual != crc:
            raise SpoolCorrupt(path, f"crc32 mismatch (stored {crc:#010x}, computed {actual:#010x})")
        frames, at = [], body
        source = data if copy else view
        for n in lengths:
            frames.append(source[at : at + n])
            at += n
        return frames

    def _scan(self) -> None:
        """Index what a previous run left; delete half-written temp files; mark corrupt batches lost."""
        for path in sorted(self.directory.iterdir()):
            if path.name.endswith(_TMP_SUFFIX):
                log.info("edge spool: deleting %s, a batch cut off mid-write", path)
                path.unlink(missing_ok=True)
                continue
            match = _NAME.match(path.name)
            if match is None or not path.is_file():
                continue
            epoch, seq = int(match[1]), int(match[2])
            try:
                self._read(path, epoch, seq)
            except (SpoolCorrupt, OSError) as exc:
                log.warning("edge spool: %s; the learner will be told this batch is lost", exc)
                self._index(epoch, seq, path.stat().st_size)
                self._mark_lost(epoch, seq)
                continue
            self._index(epoch, seq, path.stat().st_size)
            self.recovered += 1
        if self.recovered:
            log.info(
                "edge spool at %s: recovered %d unacknowledged batches (%d bytes) from a previous run",
                self.directory,
                self.recovered,
                self.bytes_used,
            )

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
