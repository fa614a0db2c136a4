"""Column segments: a chunk of replay rows in one file, written once in place and sealed atomically.

Each column is one contiguous region at a page-aligned offset, so an append is one `pwrite` per
column and a reader gets zero-copy memory maps. The header is self-describing even while the segment
is open, so after a crash the rows a commit log says are durable can still be sealed.
"""

from __future__ import annotations

import functools
import json
import math
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from user_rl.wire.checksum import crc32

MAGIC = b"URLSEG01"
FORMAT = 1
HEADER_AREA = 16 * 1024  # prefix + JSON header; the first column region starts right after it
ALIGNMENT = 4096
_PREFIX = struct.Struct("<8sII")  # magic, header length, crc32 of the header bytes
_NUMERIC_KINDS = "biufc"

Schema = dict[str, tuple[Any, tuple[int, ...]]]  # column name -> (dtype, per-row shape)


class CorruptSegment(Exception):
    """A segment file that cannot be trusted; `reason` is a stable key callers can branch on."""

    def __init__(self, path: Path | str, reason: str, detail: str = "") -> None:
        self.path = Path(path)
        self.reason = reason
        self.detail = detail
        super().__init__(f"corrupt segment {self.path} ({reason}): {detail}")

    def __reduce__(self) -> tuple:  # keep path and reason when sent to another process
        return type(self), (self.path, self.reason, self.detail)


@dataclass(frozen=True)
class SegmentInfo:
    """What a sealed segment holds, for the index."""

    path: Path
    rows: int
    capacity: int
    nbytes: int
    data_bytes: int
    column_crcs: dict[str, int]
    meta: dict[str, Any]


@dataclass
class Segment:
    """A sealed segment opened for reading; `columns` are read-only maps of the first `rows` rows."""

    path: Path
    rows: int
    capacity: int
    meta: dict[str, Any]
    nbytes: int
    columns: dict[str, np.ndarray]

    def load(self) -> dict[str, np.ndarray]:
        """Copies in RAM, so the file can be deleted or evicted from cache afterwards."""
        return {name: np.array(values) for name, values in self.columns.items()}


@dataclass(frozen=True)
class _Column:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int

    @functools.cached_property
    def row_bytes(self) -> int:  # cached: every append asks it of every column
        return self.dtype.itemsize * math.prod(self.shape)

    def to_json(self, crc32: int | None) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype.name,
            "shape": list(self.shape),
            "offset": self.offset,
            "crc32": crc32,
        }


def _storable_dtype(dtype: Any) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.kind not in _NUMERIC_KINDS or dtype.newbyteorder("<") != dtype:
        raise ValueError(f"dtype {dtype} cannot be stored: only little-endian bool/int/float/complex")
    return dtype


def _plan_columns(schema: Schema, capacity: int) -> list[_Column]:
    """Place each column's region after the header, each at a page-aligned offset."""
    columns, offset = [], HEADER_AREA
    for name, (dtype, shape) in schema.items():
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"column {name!r}: negative dimension in shape {shape}")
        column = _Column(str(name), _storable_dtype(dtype), shape, offset)
        columns.append(column)
        offset = -(-(offset + capacity * column.row_bytes) // ALIGNMENT) * ALIGNMENT
    return columns


def _regions_end(columns: list[_Column], capacity: int) -> int:
    return max([HEADER_AREA] + [c.offset + capacity * c.row_bytes for c in columns])


def _header(
    columns: list[_Column], capacity: int, rows: int, sealed: bool, crcs: list[int | None], meta: dict[str, Any]
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "sealed": sealed,
        "rows": rows,
        "capacity": capacity,
        "meta": meta,
        "columns": [c.to_json(crc) for c, crc in zip(columns, crcs)],
    }


def _encode_header(header: dict[str, Any]) -> bytes:
    body = json.dumps(header, separators=(",", ":")).encode()
    if _PREFIX.size + len(body) > HEADER_AREA:
        raise ValueError(f"segment header is {len(body)} bytes; at most {HEADER_AREA - _PREFIX.size} fit")
    return (_PREFIX.pack(MAGIC, len(body), zlib.crc32(body)) + body).ljust(HEADER_AREA, b"\0")


def _pwrite_all(fd: int, data: np.ndarray | bytes, offset: int) -> None:
    """Write every byte; a single pwrite may stop short (e.g. Linux's ~2 GiB cap per call)."""
    view = memoryview(data) if isinstance(data, bytes) else data.reshape(-1).view(np.uint8)
    done = os.pwrite(fd, view, offset)
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _seal(
    fd: int,
    open_path: Path,
    final_path: Path,
    columns: list[_Column],
    capacity: int,
    rows: int,
    crcs: list[int],
    meta: dict[str, Any],
) -> SegmentInfo:
    """Write the sealed header, sync and close `fd`, rename into place, make the rename durable."""
    try:
        _pwrite_all(fd, _encode_header(_header(columns, capacity, rows, True, crcs, meta)), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(open_path, final_path)
    for directory in {final_path.parent.resolve(), open_path.parent.resolve()}:
        _fsync_dir(directory)
    return SegmentInfo(
        final_path,
        rows,
        capacity,
        os.stat(final_path).st_size,
        rows * sum(c.row_bytes for c in columns),
        {c.name: crc for c, crc in zip(columns, crcs)},
        meta,
    )


class SegmentWriter:
    """Appends rows into an open segment file; `seal` publishes it under its final name."""

    def __init__(self, path: Path, schema: Schema, capacity: int, meta: dict[str, Any] | None = None) -> None:
        if capacity < 1 or not schema:
            raise ValueError(f"a segment needs capacity >= 1 and at least one column (got {capacity}, {schema})")
        self.path = Path(path)
        self._columns = _plan_columns(schema, capacity)
        self._capacity = capacity
        self._meta = dict(meta or {})
        self._rows = 0
        self._crcs = [0] * len(self._columns)
        # The sealed header is the largest this segment can need; refuse now rather than at seal.
        _encode_header(_header(self._columns, capacity, capacity, True, [0xFFFFFFFF] * len(self._crcs), self._meta))
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(self._fd, _regions_end(self._columns, capacity))  # sparse: unused rows cost no disk
            _pwrite_all(self._fd, self._encode(sealed=False, meta=self._meta), 0)
        except BaseException:
            self.abort()
            raise

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def remaining(self) -> int:
        return self._capacity - self._rows

    def append(self, columns: dict[str, np.ndarray] | list[dict[str, np.ndarray]]) -> tuple[int, int]:
        """Write n rows of every column; returns their (start, end) row range. All checks come first.

        `columns` may be a list of parts, each with every column, written one after the other: rows
        that arrive in pieces (a batch's records, then its episodes' final observations) are not
        concatenated first, which would copy every image once more."""
        fd = self._require_open()
        parts = columns if isinstance(columns, list) else [columns]
        arrays: list[list[np.ndarray]] = [[] for _ in self._columns]
        n = 0
        for part in parts:
            n += self._check(part, arrays)
        if n > self.remaining:
            raise ValueError(f"append of {n} rows exceeds the segment's remaining {self.remaining} rows")
        start = self._rows
        for column, pieces in zip(self._columns, arrays):
            offset = column.offset + start * column.row_bytes
            for values in pieces:
                _pwrite_all(fd, values, offset)
                offset += values.nbytes
        crcs = []
        for pieces, crc in zip(arrays, self._crcs):
            for values in pieces:
                crc = crc32(values, crc)
            crcs.append(crc)
        self._crcs = crcs
        self._rows = start + n
        return start, self._rows

    def _check(self, columns: dict[str, np.ndarray], arrays: list[list[np.ndarray]]) -> int:
        """Check one part's columns against the schema and add them (C-contiguous) to `arrays`, one
        list a column; returns its rows."""
        unknown = set(columns) - {c.name for c in self._columns}
        if unknown:
            raise ValueError(f"columns {sorted(unknown)} are not in the segment schema")
        n = None
        for column, pieces in zip(self._columns, arrays):
            if column.name not in columns:
                raise KeyError(f"column {column.name!r} is missing from the append")
            values = columns[column.name]
            if not isinstance(values, np.ndarray) or values.dtype != column.dtype:
                got = values.dtype if isinstance(values, np.ndarray) else type(values).__name__
                raise ValueError(f"column {column.name!r}: expected dtype {column.dtype}, got {got}")
            if values.shape[1:] != column.shape or values.ndim != 1 + len(column.shape):
                raise ValueError(
                    f"column {column.name!r}: expected rows of shape {column.shape}, got array of shape {values.shape}"
                )
            if n is not None and len(values) != n:
                raise ValueError(f"column {column.name!r} has {len(values)} rows, other columns have {n}")
            n = len(values)
            pieces.append(np.ascontiguousarray(values))
        assert n is not None
        return n

    def sync(self) -> None:
        """Make the appended rows durable (the header is only rewritten at seal)."""
        os.fdatasync(self._require_open())

    def seal(self, final_path: Path, meta: dict[str, Any] | None = None) -> SegmentInfo:
        """Write the final header, sync, rename to `final_path`; the writer is closed afterwards."""
        fd = self._require_open()
        merged = {**self._meta, **(meta or {})}
        self._encode(sealed=True, meta=merged)  # a header that does not fit fails here, still open
        self._fd = None
        return _seal(fd, self.path, Path(final_path), self._columns, self._capacity, self._rows, self._crcs, merged)

    def close(self) -> None:
        """Close the file, leaving it for crash recovery (after a write failure)."""
        self._close()

    def abort(self) -> None:
        """Discard the open segment: close and delete its file."""
        self._close()
        self.path.unlink(missing_ok=True)

    def _encode(self, sealed: bool, meta: dict[str, Any]) -> bytes:
        crcs = self._crcs if sealed else [None] * len(self._columns)
        return _encode_header(_header(self._columns, self._capacity, self._rows, sealed, crcs, meta))

    def _require_open(self) -> int:
        if self._fd is None:
            raise ValueError(f"segment writer for {self.path} is closed")
        return self._fd

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# -- reading and recovery ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    header: dict[str, Any]
    columns: list[_Column]
    file_size: int


def _require(condition: bool, problem: str) -> None:
    if not condition:
        raise ValueError(problem)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_header(header: Any) -> list[_Column]:
    """Validate a decoded header and return its columns; ValueError names the first problem."""
    _require(isinstance(header, dict) and header.get("format") == FORMAT, "not a format-1 header object")
    sealed, rows, capacity = header.get("sealed"), header.get("rows"), header.get("capacity")
    _require(isinstance(sealed, bool) and isinstance(header.get("meta"), dict), "bad 'sealed' or 'meta'")
    _require(
        _is_int(rows) and _is_int(capacity) and 0 <= rows <= capacity and capacity >= 1,
        f"bad rows/capacity {rows!r}/{capacity!r}",
    )
    entries = header.get("columns")
    _require(isinstance(entries, list) and len(entries) > 0, "no columns")
    columns: list[_Column] = []
    region_end = HEADER_AREA
    for entry in entries:
        _require(isinstance(entry, dict) and isinstance(entry.get("name"), str), f"bad column entry {entry!r:.80}")
        name, dtype, shape, offset, crc = (entry.get(k) for k in ("name", "dtype", "shape", "offset", "crc32"))
        _require(isinstance(dtype, str), f"column {name!r}: bad dtype {dtype!r}")
        _require(isinstance(shape, list) and all(_is_int(d) and d >= 0 for d in shape), f"column {name!r}: bad shape")
        _require(
            _is_int(offset) and offset >= region_end and offset % ALIGNMENT == 0,
            f"column {name!r}: bad offset {offset!r}",
        )
        _require(
            (crc is None and not sealed) or (_is_int(crc) and 0 <= crc <= 0xFFFFFFFF),
            f"column {name!r}: bad crc32 {crc!r}",
        )
        columns.append(_Column(name, _storable_dtype(dtype), tuple(shape), offset))
        region_end = offset + capacity * columns[-1].row_bytes
    _require(len({c.name for c in columns}) == len(columns), "duplicate column names")
    return columns


def _load_layout(path: Path) -> _Layout:
    """Read and check the header of a segment, open or sealed; every problem is a CorruptSegment."""
    try:
        with open(path, "rb") as file:
            file_size = os.fstat(file.fileno()).st_size
            area = file.read(HEADER_AREA)
    except FileNotFoundError:
        raise CorruptSegment(path, "missing", "no such file") from None
    if len(area) < HEADER_AREA:
        raise CorruptSegment(path, "short", f"{len(area)} bytes, less than the {HEADER_AREA}-byte header area")
    magic, length, crc = _PREFIX.unpack_from(area)
    if magic != MAGIC:
        raise CorruptSegment(path, "bad_magic", f"starts with {magic!r}, not {MAGIC!r}")
    if length > HEADER_AREA - _PREFIX.size:
        raise CorruptSegment(path, "bad_header", f"header length {length} exceeds the header area")
    body = area[_PREFIX.size : _PREFIX.size + length]
    if zlib.crc32(body) != crc:
        raise CorruptSegment(path, "header_crc", f"header crc32 {zlib.crc32(body):#010x} != stored {crc:#010x}")
    try:
        header = json.loads(body)
        columns = _check_header(header)
    except Exception as error:  # whatever a damaged header provokes is corruption, never a crash
        raise CorruptSegment(path, "bad_header", f"{type(error).__name__}: {error}") from None
    needed = _regions_end(columns, header["capacity"])
    if file_size < needed:
        raise CorruptSegment(path, "truncated", f"{file_size} bytes, but the column regions end at {needed}")
    return _Layout(header, columns, file_size)


def _map_rows(path: Path, column: _Column, rows: int) -> np.ndarray:
    shape = (rows, *column.shape)
    if rows * column.row_bytes == 0:  # mmap cannot map zero bytes
        empty = np.zeros(shape, column.dtype)
        empty.flags.writeable = False
        return empty
    return np.memmap(path, column.dtype, "r", column.offset, shape)


def read_layout(path: Path) -> dict[str, Any]:
    """The decoded header of a segment, sealed or still open (for recovery and tools)."""
    return _load_layout(Path(path)).header


def read_segment(path: Path, verify: bool = True) -> Segment:
    """Open a sealed segment; `verify` checks every column's crc32 against the header."""
    path = Path(path)
    layout = _load_layout(path)
    header = layout.header
    if not header["sealed"]:
        raise CorruptSegment(path, "not_sealed", "the segment is still open (recover it with seal_open_file)")
    columns = {c.name: _map_rows(path, c, header["rows"]) for c in layout.columns}
    if verify:
        for entry in header["columns"]:
            actual = crc32(columns[entry["name"]])
            if actual != entry["crc32"]:
                raise CorruptSegment(
                    path,
                    "column_crc",
                    f"column {entry['name']!r}: crc32 {actual:#010x} != header {entry['crc32']:#010x}",
                )
    return Segment(path, header["rows"], header["capacity"], header["meta"], layout.file_size, columns)


def read_segment_into(path: Path, targets: dict[str, np.ndarray], verify: bool = True) -> tuple[int, set[str]]:
    """Read a sealed segment's columns straight into preallocated arrays (a RAM cache slot).

    The columns lie one after the other in the file, so one `preadv` fills every target's rows (the
    alignment gaps between them go to a scratch buffer): the GIL is released once, for the whole
    copy, and a thread loading a segment this way barely slows the threads that keep sampling.
    (Reading through `read_segment`'s memory maps costs a numpy copy and its page faults per column,
    with the GIL taken back in between.) A column whose dtype or row shape differs from its
    target's is converted through a map. Returns the rows read and the names of the target columns
    the segment has. `verify` checks each column's crc32 on the copy (zlib releases the GIL too).
    """
    path = Path(path)
    layout = _load_layout(path)
    header = layout.header
    if not header["sealed"]:
        raise CorruptSegment(path, "not_sealed", "the segment is still open (recover it with seal_open_file)")
    rows = header["rows"]
    crcs = {entry["name"]: entry["crc32"] for entry in header["columns"]}
    direct: list[tuple[int, memoryview]] = []  # (file offset, the target's bytes), in file order
    stored: dict[str, np.ndarray] = {}
    for column in sorted(layout.columns, key=lambda c: c.offset):
        target = targets.get(column.name)
        if target is None:  # not wanted: mapped only to be checked, so a verified segment is checked whole
            if verify:
                stored[column.name] = _map_rows(path, column, rows)
        elif target.dtype != column.dtype or target.shape[1:] != column.shape or not target.flags.c_contiguous:
            target[:rows] = stored[column.name] = _map_rows(path, column, rows)
        else:
            stored[column.name] = target[:rows]
            if rows:
                direct.append((column.offset, memoryview(target[:rows]).cast("B")))
    if direct:
        fd = os.open(path, os.O_RDONLY)
        try:
            _read_gathered(fd, direct, path)
        finally:
            os.close(fd)
    if verify:
        for name, values in stored.items():
            actual = crc32(values)
            if actual != crcs[name]:
                raise CorruptSegment(
                    path, "column_crc", f"column {name!r}: crc32 {actual:#010x} != header {crcs[name]:#010x}"
                )
    return rows, {name for name in stored if name in targets}


_LARGEST_GAP = 1 << 20  # bytes between two columns read through rather than skipped with a second call


def _read_gathered(fd: int, parts: list[tuple[int, memoryview]], path: Path) -> None:
    """Fill each (file offset, view), in file order, with as few `preadv` calls as the gaps allow."""
    runs: list[list[tuple[int, memoryview]]] = []
    for offset, view in parts:
        if runs and offset - (runs[-1][-1][0] + len(runs[-1][-1][1])) <= _LARGEST_GAP:
            runs[-1].append((offset, view))
        else:
            runs.append([(offset, view)])
    scratch = memoryview(
        bytearray(max((b[0] - a[0] - len(a[1]) for run in runs for a, b in zip(run, run[1:])), default=0))
    )
    for run in runs:
        views = [run[0][1]]
        for (offset, view), (next_offset, next_view) in zip(run, run[1:]):
            gap = next_offset - offset - len(view)
            views += [scratch[:gap], next_view] if gap else [next_view]
        _read_fully(fd, views, run[0][0], path)


def _read_fully(fd: int, views: list[memoryview], offset: int, path: Path) -> None:
    """Fill `views` from consecutive bytes at `offset` (a regular file's read returns less only at its end)."""
    while views:
        got = os.preadv(fd, views, offset)
        if not got:
            missing = sum(len(v) for v in views)
            raise CorruptSegment(path, "short", f"the file ends {missing} bytes before its columns' rows")
        offset += got
        while views and got >= len(views[0]):
            got -= len(views[0])
            views = views[1:]
        if got:
            views = [views[0][got:], *views[1:]]


def verify_segment(path: Path) -> CorruptSegment | None:
    """The problem with a sealed segment file, or None when it reads back intact."""
    try:
        read_segment(path, verify=True)
    except CorruptSegment as problem:
        return problem
    return None


def seal_open_file(open_path: Path, rows: int, final_path: Path, meta: dict[str, Any] | None = None) -> SegmentInfo:
    """Crash recovery: seal the first `rows` rows of an open segment (the rows a commit log made durable)."""
    open_path, final_path = Path(open_path), Path(final_path)
    layout = _load_layout(open_path)
    capacity = layout.header["capacity"]
    if not 0 <= rows <= capacity:
        raise ValueError(f"cannot seal {rows} rows of {open_path}: its capacity is {capacity}")
    crcs = [crc32(_map_rows(open_path, c, rows)) for c in layout.columns]
    merged = {**layout.header["meta"], **(meta or {})}
    _encode_header(_header(layout.columns, capacity, rows, True, crcs, merged))  # fits, before touching the file
    fd = os.open(open_path, os.O_RDWR)
    return _seal(fd, open_path, final_path, layout.columns, capacity, rows, crcs, merged)


def drop_from_page_cache(path: Path) -> None:
    """Evict a file's cached pages so a benchmark measures cold reads; a no-op where unsupported."""
    if not hasattr(os, "posix_fadvise"):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
    finally:
        os.close(fd)
