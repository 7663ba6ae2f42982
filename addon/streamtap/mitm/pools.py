"""The Tap's analysis worker pools, and the change from one pool to the next.

New flows go to one pool (``Workers``), or into the proxy's loop with ``streamtap_workers=0``.
A change of ``streamtap_workers`` while mitmproxy runs sends new flows to a new pool (or the
loop) and retires the old pool: it finishes the flows it holds, then its workers stop. Flows
never move between pools, so each gets one verdict, from the pool it started in.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from streamtap.mitm.worker import RemoteFlow, Workers, stop_pools

log = logging.getLogger("streamtap")

# A changed streamtap_workers is applied this long after the last change: mitmweb's number field
# sends one update per keystroke (typing 16 would start a pool of 1, then one of 16), and an
# update mitmproxy rolls back sets the count back within the same turn.
RESIZE_AFTER = 0.5


class Pools:
    """``current`` takes new flows (None: they are analysed in the proxy's loop); ``retiring``
    finish theirs. ``into_loop`` is called when new flows move into the proxy's loop.

    ``begin`` starts the first pool when mitmproxy runs; ``want`` applies a change of the count
    from then on, starting the new pool off the loop (``starting`` meanwhile)."""

    def __init__(self, *, verdict: Callable[[RemoteFlow, dict], None], lost: Callable[[RemoteFlow, str], None],
                 into_loop: Callable[[], None]) -> None:
        self.current: Workers | None = None
        self.retiring: list[Workers] = []  # pools a change replaced, finishing the flows they hold
        self.wanted = 0  # what streamtap_workers says
        self.starting = False  # a pool is being started off the loop
        self.stopped = False
        self._loop: asyncio.AbstractEventLoop | None = None  # set by begin(): changes of the count apply from then on
        self._verdict, self._lost, self._into_loop = verdict, lost, into_loop
        self._timer: asyncio.TimerHandle | None = None

    def answer_to(self, *, verdict: Callable[[RemoteFlow, dict], None], lost: Callable[[RemoteFlow, str], None],
                  into_loop: Callable[[], None]) -> None:
        """The verdicts of every pool go to these from now on (a script reload's new Tap)."""
        self._verdict, self._lost, self._into_loop = verdict, lost, into_loop
        for workers in self.all():
            workers.verdict, workers.lost = verdict, lost

    def begin(self, loop: asyncio.AbstractEventLoop | None, count: int) -> None:
        """mitmproxy runs: the first pool, of ``count`` workers, started in the loop (it carries
        nothing yet). Without a loop (hooks called from a script or a test) there are no workers,
        and a change of the count is not applied."""
        self._loop = loop
        if loop is None or not count or self.current is not None:
            return
        try:
            self.current = Workers(count, loop, verdict=self._verdict, lost=self._lost)
        except Exception as exc:  # analysis runs in the proxy's loop instead
            log.warning(f"streamtap: cannot start analysis workers: {type(exc).__name__}: {exc}; analysing in the proxy")

    def want(self, count: int) -> None:
        """``streamtap_workers`` is ``count``: applied RESIZE_AFTER after the last change, once running."""
        self.wanted = count
        if self._loop is None or self._loop.is_closed():  # not running (yet): begin() starts them
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(RESIZE_AFTER, self._resize)

    def all(self) -> list[Workers]:
        """Every pool: the one that takes new flows, and those that finish their flows."""
        return [self.current, *self.retiring] if self.current is not None else list(self.retiring)

    def expire(self) -> None:
        """Each pool's periodic work (hung workers, the ring's memory); retired pools whose workers are gone are let go."""
        for workers in self.all():
            try:
                workers.expire()
            except Exception as exc:
                log.warning(f"streamtap: analysis workers: {type(exc).__name__}: {exc}")
        self.retiring = [workers for workers in self.retiring if not workers.gone]

    def stop(self, starting: float | None = None) -> None:
        """mitmproxy stops (or the script is removed): every worker stops, leaving its open recordings
        marked incomplete; a worker still starting that holds flows gets ``starting`` seconds for it."""
        self.stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        stop_pools(self.all(), starting=starting)  # against one deadline: a pool does not wait for the one before
        self.current = None
        self.retiring = []

    # the change of count ---------------------------------------------------------------
    def _current_size(self) -> int:
        return len(self.current.processes) if self.current is not None else 0

    def _resize(self) -> None:
        """A new pool (or the proxy's loop, for 0) takes new flows; the old pool finishes the
        flows it holds, then its workers stop. The new pool's processes start off the loop (16 of
        them take most of a second), and the flows that come meanwhile go where they went before."""
        self._timer = None
        count = self.wanted
        if self.stopped or self.starting or count == self._current_size():
            return  # a start under way looks at the count again when it is done
        if not count:
            self._replace(None)
            return
        loop = self._loop
        assert loop is not None  # want() set the timer that called this on it
        self.starting = True
        starting = loop.run_in_executor(None, functools.partial(Workers, count, loop, verdict=self._verdict, lost=self._lost))
        starting.add_done_callback(functools.partial(self._pool_started, count))

    def _pool_started(self, count: int, starting: asyncio.Future) -> None:
        self.starting = False
        try:
            new = starting.result()
        except Exception as exc:
            if not self.stopped:
                self._pool_failed(count, exc)
            return
        if self.stopped:  # the proxy is shutting down (or the script was removed): no loop turn is left to see them exit
            new.stop(0.0)  # still starting: killed, not waited for, so the loop is not held
            return
        new.verdict, new.lost = self._verdict, self._lost  # a script reload's new Tap may have taken over meanwhile
        if self.wanted != count:  # changed again meanwhile: these hold no flow, and stop at once
            new.retire()
            self.retiring.append(new)
            self._resize_if_idle()
            return
        self._replace(new)

    def _pool_failed(self, count: int, exc: Exception) -> None:
        running = self._current_size()
        if self.wanted != count:  # changed meanwhile: that count is tried
            log.warning(f"streamtap: cannot start {count} analysis workers: {type(exc).__name__}: {exc}")
            self._resize_if_idle()
            return
        log.warning(f"streamtap: cannot start {count} analysis workers: {type(exc).__name__}: {exc}; "
                    f"streamtap_workers stays {running}")
        self.wanted = running
        try:  # the option says what runs; its configure() calls want(running), which then starts nothing
            from mitmproxy import ctx

            ctx.options.update(streamtap_workers=running)
        except Exception:
            pass

    def _resize_if_idle(self) -> None:
        """The count changed while a start ran: a pending timer applies it, else it is applied now
        (its timer fired during the start, and waited then)."""
        if self._timer is None:
            self._resize()

    def _replace(self, new: Workers | None) -> None:
        old = self.current
        if old is not None:
            old.retire()
            self.retiring.append(old)
        self.current = new
        if new is None:  # the flusher may be in a sleep of EXPIRE_EVERY: taps in the loop need FLUSH_EVERY
            self._into_loop()
        where = f"{len(new.processes)} analysis worker(s)" if new is not None else "the proxy's loop (streamtap_workers=0)"
        held = f"; the {len(old.flows)} flow(s) under way finish in the workers they started in" if old is not None and old.flows else ""
        log.info(f"streamtap: new flows are analysed in {where}{held}")

