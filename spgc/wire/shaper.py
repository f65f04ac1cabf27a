"""A delay and bandwidth shaper for TCP links on one machine: what a WAN between two
organisations does to the servers' links, without root (no tc/netem).

:class:`Shaper` runs an asyncio loop in a thread; :meth:`Shaper.proxy` listens on a loopback
port and forwards every connection to a target address, byte for byte (TLS passes through
untouched: the proxy never terminates it). Each direction of the emulated link is a
:class:`Pacer`: a chunk read from one side leaves the link's "wire" once the wire has carried
the chunks before it at the configured rate (one token bucket per direction, shared by every
connection of that direction, as one physical link is), and reaches the other side ``delay``
seconds later (one-way delay: half the round trip). The reader waits for its chunk's
serialisation before reading on, so a fast sender is held back by TCP as on a real link, and at
most the bandwidth-delay product is in flight in the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

__all__ = ["Pacer", "Shaper"]

#: Bytes read at once from one side of a proxied connection.
READ_BYTES = 64 * 1024
#: Chunks in flight per direction of one connection when the rate is unlimited.
MAX_QUEUED_CHUNKS = 1024


class Pacer:
    """One direction of the emulated link: ``mbit`` Mbit/s (0: unlimited) shared by every
    connection that uses it, then ``delay`` seconds of propagation."""

    def __init__(self, delay: float, mbit: float = 0.0) -> None:
        if delay < 0 or mbit < 0:
            raise ValueError(f"delay and rate must be >= 0, got {delay} s, {mbit} Mbit/s")
        self.delay = float(delay)
        self.bytes_per_s = mbit * 1e6 / 8 if mbit > 0 else 0.0
        self._free_at = 0.0  # loop time when the wire finishes the chunks handed to it
        self.bytes = 0

    def schedule(self, now: float, size: int) -> tuple[float, float]:
        """(when the chunk has left the wire, when it reaches the other side), in loop time."""
        self.bytes += size
        if self.bytes_per_s <= 0:
            return now, now + self.delay
        sent = max(now, self._free_at) + size / self.bytes_per_s
        self._free_at = sent
        return sent, sent + self.delay


class Shaper:
    """Proxies with emulated WAN links, on an event loop in a daemon thread; ``close()``
    stops them all (a context manager too)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.AbstractServer] = []
        self._tasks: set[asyncio.Task] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="spgc-shaper")
        self._thread.daemon = True
        self._thread.start()

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def proxy(
        self, target: tuple[str, int], forward: Pacer, backward: Pacer, host: str = "127.0.0.1"
    ) -> tuple[str, int]:
        """Listen on a free port of ``host``; each connection is forwarded to ``target``, the
        dialer's bytes through ``forward`` and the answers through ``backward``. Returns the
        address to dial instead of ``target``."""

        async def start() -> tuple[str, int]:
            async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                task = asyncio.current_task()
                assert task is not None
                self._tasks.add(task)
                try:
                    await self._connection(r, w, target, forward, backward)
                finally:
                    self._tasks.discard(task)

            server = await asyncio.start_server(handle, host, 0)
            self._servers.append(server)
            return server.sockets[0].getsockname()[:2]

        return self._call(start())

    async def _connection(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        target: tuple[str, int],
        forward: Pacer,
        backward: Pacer,
    ) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        pipes = [
            asyncio.ensure_future(_pipe(reader, up_writer, forward)),
            asyncio.ensure_future(_pipe(up_reader, writer, backward)),
        ]
        try:
            await asyncio.gather(*pipes)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for pipe in pipes:
                pipe.cancel()
            for w in (writer, up_writer):
                w.close()

    def close(self) -> None:
        """Stop listening, cut every proxied connection, end the loop's thread."""

        async def stop() -> None:
            for server in self._servers:
                server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.sleep(0)

        if self._loop.is_running():
            self._call(stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> Shaper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pacer: Pacer) -> None:
    """Copy one direction: read, wait out the chunk's serialisation on the wire, hand it to the
    delivery task, which writes it once its propagation delay is over; EOF is passed on after
    the last chunk."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(MAX_QUEUED_CHUNKS)

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    delivery = asyncio.ensure_future(deliver())
    try:
        while True:
            data = await reader.read(READ_BYTES)
            sent, due = pacer.schedule(loop.time(), len(data))
            await queue.put((due, data))
            if not data:
                break
            wait = sent - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
        await delivery
    finally:
        delivery.cancel()
