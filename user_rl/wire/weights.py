"""Policy weights as one byte buffer cut into chunks, so a late or reconnecting edge can fetch them.

The layout (name, dtype, shape of each tensor, in order) travels in the announcement; each
chunk is one raw frame. Casting to bfloat16 halves the bytes for edges that can run it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.codec import WireError

DEFAULT_CHUNK_BYTES = 1 << 20
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
           "uint8": torch.uint8, "bool": torch.bool}
_NAMES = {v: k for k, v in _DTYPES.items()}


@dataclass
class PackedWeights:
    announce: pb.WeightsAnnounce
    chunks: list[bytes]


def pack(
    version: int,
    state: dict[str, torch.Tensor],
    cast_floats_to: torch.dtype | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> PackedWeights:
    """Flatten a state dict into an announcement plus byte chunks."""
    specs, parts = [], []
    for name, tensor in state.items():
        tensor = tensor.detach().to("cpu")
        if cast_floats_to is not None and tensor.is_floating_point():
            tensor = tensor.to(cast_floats_to)
        if tensor.dtype not in _NAMES:
            raise ValueError(f"tensor {name}: dtype {tensor.dtype} cannot be sent")
        specs.append(pb.ArraySpec(name=name, dtype=_NAMES[tensor.dtype], shape=tensor.shape))
        parts.append(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    blob = b"".join(parts)
    chunks = [blob[i : i + chunk_bytes] for i in range(0, len(blob), chunk_bytes)] or [b""]
    announce = pb.WeightsAnnounce(
        version=version, tensors=specs, total_bytes=len(blob), num_chunks=len(chunks),
        chunk_bytes=chunk_bytes, created_time=time.time(),
    )
    return PackedWeights(announce, chunks)


class WeightsAssembly:
    """Collects the chunks of one announced version; `state()` once every chunk is in."""

    def __init__(self, announce: pb.WeightsAnnounce) -> None:
        if announce.num_chunks == 0 or announce.total_bytes > announce.num_chunks * max(announce.chunk_bytes, 1):
            raise WireError("bad_announce", f"version {announce.version}: inconsistent sizes")
        self.announce = announce
        self.buffer = bytearray(announce.total_bytes)
        self.missing = set(range(announce.num_chunks))

    @property
    def version(self) -> int:
        return self.announce.version

    def add(self, index: int, data: bytes | memoryview) -> bool:
        """Store one chunk; return True when the version is complete."""
        data = memoryview(data).cast("B")
        start = index * self.announce.chunk_bytes
        end = min(start + self.announce.chunk_bytes, self.announce.total_bytes)
        if index not in range(self.announce.num_chunks) or data.nbytes != end - start:
            raise WireError("bad_chunk", f"version {self.version} chunk {index}: {data.nbytes} bytes")
        self.buffer[start:end] = data
        self.missing.discard(index)
        return not self.missing

    def state(self) -> dict[str, torch.Tensor]:
        state, offset = {}, 0
        for spec in self.announce.tensors:
            if spec.dtype not in _DTYPES:
                raise WireError("bad_dtype", f"weights {spec.name}: {spec.dtype}")
            dtype = _DTYPES[spec.dtype]
            count = 1
            for d in spec.shape:
                count *= int(d)
            nbytes = count * torch.empty(0, dtype=dtype).element_size()
            if offset + nbytes > len(self.buffer):
                raise WireError("bad_announce", f"weights {spec.name} run past the buffer")
            flat = torch.frombuffer(self.buffer, dtype=dtype, count=count, offset=offset) if count else torch.empty(0, dtype=dtype)
            state[spec.name] = flat.reshape(tuple(spec.shape)).clone()
            offset += nbytes
        return state
