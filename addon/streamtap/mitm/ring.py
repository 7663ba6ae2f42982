"""The ring: memory the proxy shares with one analysis worker, for the reads in flight to it.

The proxy copies each flow's new reads in once per batch; the worker copies them out and
acknowledges them in bulk, in the order they were put. ``Ring`` is the shared file and its
mapping; ``RingSpace`` decides where each put goes. Neither knows anything of flows.

Memory follows what is in flight, not the ring's size. The file starts sparse with ``STEP``
of memory behind it, and grows by ``STEP`` only when a put finds no room in what it has: a
put goes after the newest one while that stays within ``STEP`` of the start or the start is
busy, else back at the start, and only past the highest put in flight when neither has room.
So a worker that keeps up cycles through the first ``STEP``, and a burst takes what it needs.
After ``RELEASE_AFTER`` without growth, the memory above the highest put in flight (and above
``STEP``) is given back, ``RELEASE_STEP`` at a time. Memory is reserved before it is written
(``posix_fallocate``), so a full ``/dev/shm`` refuses a put, which the proxy handles like a full
ring; it never faults the proxy with ``SIGBUS``.
"""

from __future__ import annotations

import mmap
import os
import sys
import tempfile
from collections import deque

STEP = 1024 * 1024  # the ring takes memory this much at a time (~0.2 ms on tmpfs), and keeps this much
RELEASE_AFTER = 10.0  # seconds without growth before memory above what is in flight goes back...
RELEASE_STEP = 4 * STEP  # ...this much per call: it costs the caller's loop ~0.12 ms per MiB on tmpfs
# Linux 5.14+: map memory just reserved into the proxy in one call. Else its first write to each
# page faults, 256 times per MiB: with 4 MB answers in 16 KiB reads, 700-6,900 faults per 8 answers
# against bare mitmdump's 15-90. Python's mmap module does not name it before 3.13.
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23 if sys.platform == "linux" else None)


def _whole_steps(size: int) -> int:
    return -(-size // STEP) * STEP


class Ring:
    """A file both processes map, removed from the file system once the worker has mapped it."""

    def __init__(self, path: str, size: int, mapped: mmap.mmap, fd: int | None = None) -> None:
        self.path, self.size, self.map = path, size, mapped
        self.fd = fd  # the proxy's, kept to reserve memory; the worker only reads
        self.backed = 0  # bytes from the start with memory reserved behind them

    @classmethod
    def create(cls, size: int) -> Ring:
        """In /dev/shm (memory, not disk) where Linux has it and it has room for the first
        ``STEP`` (a container's is often 64 MB), else in the temporary folder."""
        if os.access("/dev/shm", os.W_OK):
            try:
                return cls._create_in("/dev/shm", size)
            except OSError:
                pass
        return cls._create_in(None, size)

    @classmethod
    def _create_in(cls, folder: str | None, size: int) -> Ring:
        fd, path = tempfile.mkstemp(prefix="streamtap-ring-", dir=folder)
        try:
            os.ftruncate(fd, size)  # sparse: memory comes with reserve()
            ring = cls(path, size, mmap.mmap(fd, size), fd)
            if not ring.reserve(min(size, STEP)):
                raise OSError(f"no room for the ring in {folder or tempfile.gettempdir()}")
            return ring
        except BaseException:
            os.unlink(path)
            os.close(fd)
            raise

    @classmethod
    def attach(cls, path: str, size: int) -> Ring:
        fd = os.open(path, os.O_RDWR)
        try:
            ring = cls(path, size, mmap.mmap(fd, size))
        finally:
            os.close(fd)
        ring.unlink()
        return ring

    def reserve(self, end: int) -> bool:
        """Memory behind the ring up to ``end`` (rounded up to ``STEP``); False when the file
        system has none to give."""
        if end <= self.backed:
            return True
        if self.fd is None:
            return False
        wanted = min(self.size, _whole_steps(end))
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(self.fd, self.backed, wanted - self.backed)
        except OSError:
            return False
        if MADV_POPULATE_WRITE is not None:
            try:
                self.map.madvise(MADV_POPULATE_WRITE, self.backed, wanted - self.backed)
            except (OSError, ValueError):  # an older kernel: the pages map on first write instead
                pass
        self.backed = wanted
        return True

    def release(self, above: int) -> None:
        """Give back the memory behind the ring above ``above`` (where nothing is in flight),
        rounded up to a whole ``STEP`` and at least one, and at most ``RELEASE_STEP`` of it from
        the top. Where the system cannot, the memory stays: it costs room, not correctness."""
        keep = max(STEP, _whole_steps(above), self.backed - RELEASE_STEP)
        if self.backed <= keep:
            return
        try:
            self.map.madvise(mmap.MADV_REMOVE, keep, self.backed - keep)
        except (AttributeError, OSError, ValueError):
            return
        self.backed = keep

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def close(self) -> None:
        """The proxy is done with it (the worker stopped or died): the name, the file and the memory go."""
        self.unlink()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.map.close()

    def put(self, at: int, chunks: list[bytes]) -> None:
        """The chunks one after another from ``at`` (the caller joins small ones first: see JOIN_BELOW)."""
        mapped = self.map
        for chunk in chunks:
            end = at + len(chunk)
            mapped[at:end] = chunk
            at = end

    def get(self, at: int, length: int) -> bytes:
        return self.map[at : at + length]


class RingSpace:
    """Where the puts in flight are, and where the next one goes.

    The worker acknowledges puts in the order they were made, so what is in flight is a queue of
    runs, each a stretch of puts that followed one another in the ring, oldest first. A put
    never straddles the ring's end."""

    def __init__(self, size: int, keep: int = STEP) -> None:
        self.size, self.keep = size, keep
        self.runs: deque[list[int]] = deque()  # [start, end) of each run in flight, oldest first
        self.in_flight = 0  # bytes put and not yet acknowledged

    def where(self, length: int, backed: int) -> int | None:
        """Where ``length`` bytes go, given the memory behind the ring; None when nothing in
        the ring is free for them."""
        runs = self.runs
        if not runs:
            return 0 if length <= self.size else None
        tail = runs[-1][1]
        if len(runs) == 1:  # the usual case: one stretch, [head, tail)
            after = tail + length <= self.size
            if after and tail + length <= min(backed, self.keep):
                return tail
            if length <= runs[0][0] and length <= backed:  # the start is free
                return 0
            return tail if after else None
        at_tail = self._free(tail, length)
        if at_tail and tail + length <= min(backed, self.keep):
            return tail
        if length <= backed and self._free(0, length):
            return 0
        if at_tail:
            return tail
        # the gaps the acknowledgements opened: right after a run in flight
        return next((end for _, end in runs if self._free(end, length)), None)

    def _free(self, at: int, length: int) -> bool:
        end = at + length
        return end <= self.size and all(stop <= at or start >= end for start, stop in self.runs)

    def take(self, at: int, length: int) -> None:
        """``length`` bytes were put at ``at`` (where ``where`` said)."""
        runs = self.runs
        if runs and runs[-1][1] == at:
            runs[-1][1] += length
        else:
            runs.append([at, at + length])
        self.in_flight += length

    def acknowledge(self, consumed: int) -> None:
        """The worker is done with the oldest ``consumed`` bytes put."""
        self.in_flight = max(0, self.in_flight - consumed)
        runs = self.runs
        while consumed > 0 and runs:
            run = runs[0]
            if consumed >= run[1] - run[0]:
                consumed -= run[1] - run[0]
                runs.popleft()
            else:
                run[0] += consumed
                consumed = 0

    def top(self) -> int:
        """Where the highest put in flight ends (0: nothing in flight)."""
        return max((end for _, end in self.runs), default=0)
