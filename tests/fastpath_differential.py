"""A dialect's text-delta fast path on against off: the same turn and verdict, or the test fails.

Off is the assembler's fast-path method replaced by one that declines, so every event takes
the full parse; on, the method is wrapped to count the events it took. Each read is given its
own arrival time, so the turns' timing is compared as well."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from provider_streams import cut_points

from streamtap.providers import Dialect, StreamEnd, StreamSession


# how generated streams serialise their JSON (a "style" step switches among them mid-stream)
STYLES = [lambda o: json.dumps(o, separators=(",", ":")), json.dumps,
          lambda o: json.dumps(o, ensure_ascii=False, separators=(",", ":"))]


MAX_CUTS = 80  # per capture


class FastPath:
    def __init__(self, dialect: Dialect, assembler: type, method: str) -> None:
        self.dialect, self.assembler, self.method = dialect, assembler, method

    def judged(self, body: bytes, *, fast: bool, chunk_size: int | None = None) -> tuple[dict, dict, int]:
        """(turn, verdict, fast-path hits) of ``body``, with the fast path on or off."""
        hits = 0
        taken = getattr(self.assembler, self.method)

        def counted(assembler, data, t):
            nonlocal hits
            if not fast:
                return False  # every event takes the full parse
            done = taken(assembler, data, t)
            hits += done
            return done

        setattr(self.assembler, self.method, counted)
        try:
            # each read arrives at its own time, so the turn's timing (the first content's) is compared too
            session = StreamSession(self.dialect)
            step = chunk_size or len(body) or 1
            for number, at in enumerate(range(0, len(body), step)):
                session.feed(body[at : at + step], float(number))
            analysis = session.close(StreamEnd.FINISHED)
        finally:
            setattr(self.assembler, self.method, taken)
        return analysis.turn.to_dict(), analysis.verdict.to_dict(), hits

    def assert_same(self, body: bytes, chunk_size: int | None = None) -> int:
        """The fast path's hits, once on and off gave the same turn and verdict."""
        fast_turn, fast_verdict, hits = self.judged(body, fast=True, chunk_size=chunk_size)
        full_turn, full_verdict, _ = self.judged(body, fast=False, chunk_size=chunk_size)
        assert fast_verdict == full_verdict
        assert fast_turn == full_turn
        return hits

    def assert_captures_alike(self, bodies: dict[str, bytes], spans: Callable[[bytes], list[tuple[int, int]]], *,
                              least: int, absent: str) -> None:
        """Every body whole, in 7-byte reads, and cut at its event ends and inside events (at most
        MAX_CUTS of them, spread over it); the fast
        path took more than ``least`` events of the whole bodies. No bodies: skipped, saying ``absent``."""
        if not bodies:
            pytest.skip(f"{absent} under ../shared/fixtures (absent)")
        total_hits = 0
        for _, body in sorted(bodies.items()):
            total_hits += self.assert_same(body)
            self.assert_same(body, chunk_size=7)
            cuts = cut_points(body, spans(body))
            # each cut judges the body up to it again: a long capture's cuts are spread over it, not all taken
            for cut in cuts[:: -(-len(cuts) // MAX_CUTS)]:
                self.assert_same(body[:cut])
        assert total_hits > least, "the fast path never took a real delta"

    def assert_caught(self, body: bytes) -> None:
        """An adversarial body: judged alike, with the fast path taking an event before the
        trouble, and the full path's rule still catching it (corrupt or errored)."""
        assert self.assert_same(body) >= 1, "the fast path was not exercised"
        _, verdict, _ = self.judged(body, fast=True)
        assert verdict["kind"] in ("corrupt", "errored"), verdict

    def adversarial_test(self, generate: Callable[[list, int], bytes], cases: dict[str, list]) -> Callable:
        """A test per named case of ``cases``, each built by ``generate``: ``assert_caught``."""

        @pytest.mark.parametrize("name", sorted(cases))
        def test(name):
            self.assert_caught(generate(cases[name], 1))

        return test

    def generated_streams_test(self, generate: Callable[[list, int], bytes], ops: list[str], prologue: list,
                               endings: dict[str, list]) -> Callable:
        """A hypothesis test: ``prologue``, up to 40 random (operation, index, fragment number)
        steps and one of ``endings``, built by ``generate``, judged alike on and off."""

        @settings(max_examples=400, deadline=None)
        @given(
            steps=st.lists(st.tuples(st.sampled_from(ops), st.integers(0, 2), st.integers(0, 30)), max_size=40),
            seed=st.integers(0, 1000),
            ending=st.sampled_from(sorted(endings)),
            chunk_size=st.sampled_from([None, 1, 5, 64]),
        )
        def test(steps, seed, ending, chunk_size):
            self.assert_same(generate(prologue + steps + endings[ending], seed), chunk_size=chunk_size)

        return test
