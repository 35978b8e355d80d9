"""A small HTTP/1.1 load generator on asyncio: several keep-alive connections over loopback.

Requests are encoded once beforehand (method, path, headers, body as bytes); each connection
sends one, reads the whole answer (status line, headers, ``Content-Length`` body) and sends the
next, so the client's own work per request is a few microseconds and the server is what is
measured. Latency is from the first byte written to the last byte of the answer read.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["LoadResult", "encode_post", "run_load"]


def encode_post(host: str, path: str, body: bytes, content_type: str) -> bytes:
    """One ``POST`` as bytes on the wire (HTTP/1.1, keep-alive)."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


@dataclass
class LoadResult:
    """What one run of ``run_load`` measured; ``latencies`` in seconds, sorted."""

    requests: int
    seconds: float
    connections: int
    statuses: Counter[int] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)  # the first few answers, to check

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds

    def percentile_ms(self, q: float) -> float:
        index = min(len(self.latencies) - 1, int(q * len(self.latencies)))
        return round(self.latencies[index] * 1000, 2)


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if length is None:
        raise RuntimeError(f"an answer without Content-Length: {lines[0]}")
    body = await reader.readexactly(length) if length else b""
    return status, body


async def run_load(
    host: str, port: int, requests: Sequence[bytes], connections: int, *, keep: int = 3
) -> LoadResult:
    """Send every request once over ``connections`` keep-alive connections (each takes the next
    unsent one); returns counts by status, sorted latencies and the first ``keep`` bodies."""
    result = LoadResult(len(requests), 0.0, connections)
    position = iter(range(len(requests)))
    streams = [await asyncio.open_connection(host, port) for _ in range(connections)]

    async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for index in position:
            began = time.perf_counter()
            writer.write(requests[index])
            status, body = await _read_answer(reader)
            result.latencies.append(time.perf_counter() - began)
            result.statuses[status] += 1
            if len(result.bodies) < keep:
                result.bodies.append(body)

    started = time.perf_counter()
    await asyncio.gather(*(worker(r, w) for r, w in streams))
    result.seconds = time.perf_counter() - started
    for _, writer in streams:
        writer.close()
    result.latencies.sort()
    return result
