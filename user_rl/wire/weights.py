"""Policy weights as byte buffers cut into chunks, so a late or reconnecting edge can fetch them.

A version travels as an announcement (each tensor's name, dtype and shape, in order) plus raw
chunks of its bytes. Two parts at most: the version's own bytes ("v<version>") and, when the
actor has frozen parameters (a pretrained backbone), a base part named by a hash of its bytes.
An edge keeps the base it holds, so after the first time only the trainable bytes travel.

Packing writes each tensor once into one buffer (casting floats to bfloat16 or float16 on the
way, for edges that run them); chunks are views of that buffer, never copies.

Each part carries a CRC-32 of its bytes, taken when it is published: the edge applies a part only
if what it assembled matches, so a buffer overwritten while a slow or hung edge still received it
can never become a policy made of two versions.
"""

from __future__ import annotations

import hashlib
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import WireError

DEFAULT_CHUNK_BYTES = 1 << 20
_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}
CASTS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}  # `learner.weight_dtype`


# -- layout: where each tensor lives in a part's buffer ----------------------------------------

ALIGN = 8  # each tensor starts at a multiple of 8 bytes, so it can be viewed in place as its dtype


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


@dataclass(frozen=True)
class Slot:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """The tensors of one part, in order, and the bytes they take."""

    slots: tuple[Slot, ...]
    total_bytes: int

    @classmethod
    def of(cls, tensors: Iterable[tuple[str, torch.Tensor]], cast_floats_to: torch.dtype | None = None) -> Layout:
        entries = []
        for name, tensor in tensors:
            dtype = cast_floats_to if cast_floats_to is not None and tensor.is_floating_point() else tensor.dtype
            if dtype not in _NAMES:
                raise ValueError(f"tensor {name}: dtype {dtype} cannot be sent")
            entries.append((name, dtype, tuple(tensor.shape)))
        return cls.packed(entries)

    @classmethod
    def from_specs(cls, specs: Iterable[pb.ArraySpec]) -> Layout:
        """The layout an announcement describes; refuses dtypes and shapes no sender could have meant."""
        entries = []
        for spec in specs:
            if spec.dtype not in _DTYPES:
                raise WireError("bad_dtype", f"weights {spec.name}: {spec.dtype}")
            if any(d < 0 for d in spec.shape):
                raise WireError("bad_shape", f"weights {spec.name}: shape {list(spec.shape)}")
            entries.append((spec.name, _DTYPES[spec.dtype], tuple(int(d) for d in spec.shape)))
        return cls.packed(entries)

    @classmethod
    def packed(cls, entries: Iterable[tuple[str, torch.dtype, tuple[int, ...]]]) -> Layout:
        """(name, dtype, shape) one after the other, each at an aligned offset: the one rule both sides use."""
        slots, offset = [], 0
        for name, dtype, shape in entries:
            count = 1
            for d in shape:
                count *= d
            nbytes = count * torch.empty(0, dtype=dtype).element_size()
            offset = _aligned(offset)
            slots.append(Slot(name, dtype, shape, offset, nbytes))
            offset += nbytes
        return cls(tuple(slots), offset)

    def specs(self) -> list[pb.ArraySpec]:
        return [pb.ArraySpec(name=s.name, dtype=_NAMES[s.dtype], shape=s.shape) for s in self.slots]

    def write(self, buffer: torch.Tensor, state: Mapping[str, torch.Tensor]) -> None:
        """Copy (and cast) each tensor of `state` into its place in the uint8 `buffer`: one copy each."""
        with torch.no_grad():
            for s in self.slots:
                if s.nbytes:
                    buffer[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape).copy_(state[s.name].detach())

    def read(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each tensor as a view of the uint8 `buffer` (no copy)."""
        if buffer.numel() < self.total_bytes:
            raise WireError(
                "bad_announce", f"the layout needs {self.total_bytes} bytes, the buffer has {buffer.numel()}"
            )
        return {
            s.name: buffer[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape)
            if s.nbytes
            else torch.empty(s.shape, dtype=s.dtype)
            for s in self.slots
        }


# -- packed: ready to send ------------------------------------------------------------------------


@dataclass
class Part:
    """One byte buffer of a version; chunk `i` is a view of bytes [i * chunk_bytes, ...)."""

    id: str
    layout: Layout
    data: memoryview
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    crc32: int | None = None  # of `data`, taken at publish (None: not yet)

    @property
    def num_chunks(self) -> int:
        return max(1, -(-self.layout.total_bytes // self.chunk_bytes))

    def chunk(self, index: int) -> memoryview:
        return self.data[index * self.chunk_bytes : (index + 1) * self.chunk_bytes]

    def checksummed(self) -> Part:
        """This part with the checksum of its bytes as they are now."""
        return self if self.crc32 is not None else replace(self, crc32=checksum(self.data))

    def proto(self) -> pb.WeightsPart:
        return pb.WeightsPart(
            id=self.id,
            tensors=self.layout.specs(),
            total_bytes=self.layout.total_bytes,
            num_chunks=self.num_chunks,
            crc32=self.crc32,
        )


@dataclass
class PackedWeights:
    """A version ready to serve: its own part, maybe a base part, and who to tell once it is no longer needed."""

    version: int
    own: Part
    base: Part | None = None
    release: Callable[[], None] | None = None  # frees a shared buffer the trainer reuses (None: garbage-collected)
    created_time: float = field(default_factory=time.time)

    def numbered(self, version: int) -> PackedWeights:
        return replace(self, version=version, own=replace(self.own, id=own_part_id(version)))

    @property
    def announce(self) -> pb.WeightsAnnounce:
        own = self.own
        announce = pb.WeightsAnnounce(
            version=self.version,
            tensors=own.layout.specs(),
            total_bytes=own.layout.total_bytes,
            num_chunks=own.num_chunks,
            chunk_bytes=own.chunk_bytes,
            created_time=self.created_time,
            crc32=own.crc32,
        )
        if self.base is not None:
            announce.base.CopyFrom(self.base.proto())
        return announce

    @property
    def chunks(self) -> list[memoryview]:
        """The version's own chunks, in order."""
        return [self.own.chunk(i) for i in range(self.own.num_chunks)]


def checksum(data: memoryview | bytes) -> int:
    """CRC-32 of a part's bytes: zlib's runs at several GB/s, a few ms for a large policy."""
    return zlib.crc32(data)


def own_part_id(version: int) -> str:
    return f"v{version}"


def base_part_id(data: memoryview) -> str:
    """A frozen part is named by its bytes, so an edge keeps it across versions and learner restarts."""
    return "base:" + hashlib.blake2b(data, digest_size=16).hexdigest()


def byte_view(buffer: torch.Tensor) -> memoryview:
    """A uint8 CPU tensor's bytes, without a copy."""
    return memoryview(buffer.numpy()).cast("B") if buffer.numel() else memoryview(b"")


def pack(
    version: int,
    state: Mapping[str, torch.Tensor],
    cast_floats_to: torch.dtype | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    frozen: Iterable[str] = (),
) -> PackedWeights:
    """Write a state dict into one buffer (the names in `frozen` into a base part of their own)."""
    frozen = set(frozen)
    parts = []
    for names in ([n for n in state if n not in frozen], [n for n in state if n in frozen]):
        layout = Layout.of(((n, state[n]) for n in names), cast_floats_to)
        buffer = torch.empty(layout.total_bytes, dtype=torch.uint8)
        layout.write(buffer, state)
        parts.append((layout, byte_view(buffer)))
    (own_layout, own_data), (base_layout, base_data) = parts
    base = (
        Part(base_part_id(base_data), base_layout, base_data, chunk_bytes, checksum(base_data))
        if base_layout.slots
        else None
    )
    own = Part(own_part_id(version), own_layout, own_data, chunk_bytes, checksum(own_data))
    return PackedWeights(version, own, base)


# -- assembly on the edge ---------------------------------------------------------------------------


class PartAssembly:
    """Collects the chunks of one part; `state()` once every chunk is in (views of its buffer)."""

    def __init__(
        self,
        part_id: str,
        specs: Iterable[pb.ArraySpec],
        total_bytes: int,
        num_chunks: int,
        chunk_bytes: int,
        crc32: int | None,
        buffer: np.ndarray | None = None,
    ) -> None:
        """`buffer`: uint8 memory to assemble into (at least `total_bytes`), e.g. an earlier version's
        that nothing uses any more: its pages are touched already, so storing chunks costs no page
        faults (fresh memory made a 1 MiB chunk cost 0.8 ms instead of 0.1). None allocates."""
        if num_chunks == 0 or total_bytes > num_chunks * max(chunk_bytes, 1):
            raise WireError("bad_announce", f"weights {part_id}: inconsistent sizes")
        self.id = part_id
        self.layout = Layout.from_specs(specs)
        if self.layout.total_bytes > total_bytes:
            raise WireError("bad_announce", f"weights {part_id}: its tensors run past its {total_bytes} bytes")
        self.total_bytes, self.num_chunks, self.chunk_bytes = total_bytes, num_chunks, chunk_bytes
        fits = buffer is not None and buffer.dtype == np.uint8 and buffer.ndim == 1 and len(buffer) >= total_bytes
        self.buffer = buffer if fits else np.empty(total_bytes, np.uint8)
        self._bytes = memoryview(self.buffer)
        if crc32 is None:
            raise WireError("bad_announce", f"weights {part_id}: no checksum (a learner older than this edge?)")
        self.crc32 = crc32
        self.missing = set(range(num_chunks))
        self.duplicates = 0  # chunks that arrived twice (a resumed transfer should have none)

    @property
    def complete(self) -> bool:
        return not self.missing

    @property
    def held(self) -> list[int]:
        return sorted(set(range(self.num_chunks)) - self.missing)

    def add(self, index: int, data: bytes | memoryview) -> bool:
        """Store one chunk; return True when the part is complete."""
        data = memoryview(data).cast("B")
        start = index * self.chunk_bytes
        end = min(start + self.chunk_bytes, self.total_bytes)
        if index not in range(self.num_chunks) or data.nbytes != max(0, end - start):
            raise WireError("bad_chunk", f"weights {self.id} chunk {index}: {data.nbytes} bytes")
        if index not in self.missing:
            self.duplicates += 1
        self._bytes[start:end] = data
        self.missing.discard(index)
        return self.complete

    def intact(self) -> bool:
        """Whether the bytes assembled are the ones the server published (call once complete)."""
        return checksum(self._bytes[: self.total_bytes]) == self.crc32

    def state(self) -> dict[str, torch.Tensor]:
        """The tensors, as views of the buffer: while any of them lives, the buffer is in use."""
        return self.layout.read(torch.from_numpy(self.buffer))


class WeightsAssembly(PartAssembly):
    """The version's own part of an announcement (the whole version when it has no base)."""

    def __init__(self, announce: pb.WeightsAnnounce, buffer: np.ndarray | None = None) -> None:
        super().__init__(
            own_part_id(announce.version),
            announce.tensors,
            announce.total_bytes,
            announce.num_chunks,
            announce.chunk_bytes,
            announce.crc32 if announce.HasField("crc32") else None,
            buffer,
        )
        self.announce = announce

    @property
    def version(self) -> int:
        return self.announce.version


def base_assembly(announce: pb.WeightsAnnounce) -> PartAssembly | None:
    """An assembly for the announcement's base part, or None when it has none."""
    if not announce.HasField("base"):
        return None
    base = announce.base
    return PartAssembly(
        base.id,
        base.tensors,
        base.total_bytes,
        base.num_chunks,
        announce.chunk_bytes,
        base.crc32 if base.HasField("crc32") else None,
    )
