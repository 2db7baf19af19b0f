"""Weight sync over a dedicated gloo group (CPU runs and tests): learner rank 0 -> every engine.

The group is built directly from a TCPStore + ProcessGroupGloo, outside the default torch.distributed world,
so learners keep their own data-parallel group and engines need none. Rank 0 is the sender (learner rank 0),
ranks 1..N are engines. Protocol per sync (docs/design.md, Weight transport): metadata (names, dtypes, shapes) goes first as
one JSON byte tensor (data only: a peer's bytes are never unpickled; unknown dtypes or malformed shapes are
refused with ValueError), then the tensors in that fixed order, flattened into buckets of at most
`bucket_bytes` per dtype (one broadcast per bucket, not per tensor). Each side reports seconds and bytes.
"""

from __future__ import annotations

import datetime
import json
import math
import time
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

DEFAULT_BUCKET_BYTES = 64 << 20
_DTYPES = {
    str(dt).removeprefix("torch."): dt
    for dt in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    )
}

Meta = list[tuple[str, torch.dtype, tuple[int, ...]]]


def encode_meta(meta: Meta) -> bytes:
    return json.dumps([[name, str(dt).removeprefix("torch."), list(shape)] for name, dt, shape in meta]).encode()


def decode_meta(payload: bytes) -> Meta:
    """The sender's (name, dtype, shape) list; ValueError for anything but that."""
    try:
        raw = json.loads(payload.decode())
        if not isinstance(raw, list):
            raise TypeError(f"expected a list, got {type(raw).__name__}")
        meta = []
        for i, entry in enumerate(raw):
            if not isinstance(entry, list) or len(entry) != 3:
                raise TypeError(f"entry {i} is not [name, dtype, shape]")
            name, dt, shape = entry
            # exact types: json takes Infinity, 1.5, true and "3", none of which is a dimension
            if not isinstance(name, str) or not isinstance(dt, str) or not isinstance(shape, list):
                raise TypeError(f"entry {i} is not [name, dtype, shape] of a string, a string and a list")
            if not all(type(d) is int for d in shape):
                raise TypeError(f"entry {i} ({name!r}) has a dimension that is not an integer: {shape[:8]}")
            meta.append((name, _DTYPES[dt], tuple(shape)))
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, RecursionError) as e:
        raise ValueError(f"weight-sync metadata from the sender is malformed: {type(e).__name__}: {e}") from None
    if any(d < 0 for _, _, shape in meta for d in shape):
        raise ValueError("weight-sync metadata from the sender has a negative dimension")
    if any(math.prod(shape) >= 1 << 62 for _, _, shape in meta):
        raise ValueError("weight-sync metadata from the sender has a tensor too large to exist")
    return meta


class GlooWeightGroup:
    """One end of the learner -> engines broadcast group."""

    def __init__(
        self,
        master_addr: str,
        master_port: int,
        rank: int,
        world_size: int,
        timeout_s: float = 300.0,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> None:
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(master_addr, master_port, world_size, rank == 0, timeout=timeout)
        self.group = dist.ProcessGroupGloo(dist.PrefixStore("rlvr-weight-sync", self.store), rank, world_size, timeout)
        self.rank, self.world_size, self.bucket_bytes = rank, world_size, bucket_bytes

    def _broadcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([t], opts).wait()

    def _broadcast_bytes(self, payload: bytes | None) -> bytes:
        size = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64)
        self._broadcast(size)
        buf = (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            if payload is not None
            else torch.empty(int(size.item()), dtype=torch.uint8)
        )
        self._broadcast(buf)
        return buf.numpy().tobytes()

    def _buckets(self, meta: Meta) -> list[list[int]]:
        buckets: list[list[int]] = []
        size, dtype = 0, None
        for i, (_, dt, shape) in enumerate(meta):
            nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dt).element_size()
            if not buckets or dt != dtype or size + nbytes > self.bucket_bytes:
                buckets.append([])
                size, dtype = 0, dt
            buckets[-1].append(i)
            size += nbytes
        return buckets

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
        """Rank 0: broadcast the weights; returns `sync/seconds`, `sync/bytes`, `sync/num_buckets`."""
        assert self.rank == 0, "only rank 0 sends"
        t0 = time.perf_counter()
        items = [(n, t.detach().to("cpu").contiguous()) for n, t in named_tensors]
        meta = [(n, t.dtype, tuple(t.shape)) for n, t in items]
        self._broadcast_bytes(encode_meta(meta))
        total = 0
        buckets = self._buckets(meta)
        for bucket in buckets:
            flat = torch.cat([items[i][1].reshape(-1) for i in bucket])
            self._broadcast(flat)
            total += flat.numel() * flat.element_size()
        return {
            "sync/seconds": time.perf_counter() - t0,
            "sync/bytes": float(total),
            "sync/num_buckets": float(len(buckets)),
        }

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Ranks > 0: yield (name, tensor) in the sender's order (consume it fully)."""
        meta = decode_meta(self._broadcast_bytes(None))
        for bucket in self._buckets(meta):
            dtype = meta[bucket[0]][1]
            numels = [torch.Size(meta[i][2]).numel() for i in bucket]
            flat = torch.empty(sum(numels), dtype=dtype)
            self._broadcast(flat)
            for i, part in zip(bucket, torch.split(flat, numels)):
                yield meta[i][0], part.view(meta[i][2])

    def close(self) -> None:
        self.group = None  # type: ignore[assignment]
        self.store = None  # type: ignore[assignment]
