"""pytest plugin (entry point ``streamtap``): replay recordings, with faults, inside tests.

Fixture ``streamtap_replay``: a function that starts a replay server on a free loopback
port for one or more recordings (optional ``fault=``, ``timing=``, ``assign_ids=``,
``once=``, ``ignore_fields=``) and returns it (``.base_url``, ``.served`` with each
answered request and its fault log). Every server it started stops when the test ends.
Marker ``streamtap_faults(*specs)``: run the test once per fault spec (``None``: no fault);
the fixture applies the current one, also available as the ``streamtap_fault`` fixture.

A complete example (``weather.jsonl`` recorded by the Tap, or by ``streamtap import``)::

    import openai
    import pytest

    def answer(client):
        text, finish = [], None
        for chunk in client.chat.completions.create(
            model="gpt-4.1-nano", messages=[{"role": "user", "content": "Weather in Paris?"}], stream=True
        ):
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        if finish is None:
            raise RuntimeError("incomplete answer")
        return "".join(text)

    def client_for(server):
        return openai.OpenAI(base_url=server.base_url + "/v1", api_key="test", max_retries=0)

    def test_full_answer(streamtap_replay):
        assert answer(client_for(streamtap_replay("weather.jsonl"))).startswith("The weather")

    @pytest.mark.streamtap_faults("cut:event=5,style=clean", "cut:at=tool-args,style=abort")
    def test_cut_answers_are_refused(streamtap_replay):
        with pytest.raises(Exception):
            answer(client_for(streamtap_replay("weather.jsonl")))

This module is loaded by every pytest run in an environment where streamtap is
installed, so it imports nothing heavy at import time and never fails there.
"""

from __future__ import annotations

from typing import Any

import pytest

MARKER = "streamtap_faults"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*specs): run the test once per streamtap fault spec (None: no fault); "
        "the streamtap_replay fixture applies the current one",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None:
        return
    specs = list(marker.args)
    if not specs:
        raise pytest.UsageError(f"@pytest.mark.{MARKER} needs at least one fault spec (or None)")
    metafunc.fixturenames.append("streamtap_fault")
    metafunc.parametrize("streamtap_fault", specs, ids=[s or "no-fault" for s in specs])


@pytest.fixture
def streamtap_fault() -> str | None:
    """The current fault spec (set by the streamtap_faults marker; None otherwise)."""
    return None


@pytest.fixture
def streamtap_replay(streamtap_fault: str | None):
    """A factory: ``streamtap_replay(*recordings, fault=..., timing="fast", assign_ids=False, once=False,
    ignore_fields=())`` -> a running server with ``.base_url``."""
    from streamtap.replay.faults import Timing, parse_faults
    from streamtap.replay.match import Library, MatchOptions
    from streamtap.replay.server import ServeOptions, ServerThread

    started: list[Any] = []

    def start(
        *recordings: Any,
        fault: str | None = streamtap_fault,
        timing: str = "fast",
        assign_ids: bool = False,
        once: bool = False,
        ignore_fields: tuple[str, ...] = (),
    ):
        if not recordings:
            raise TypeError("streamtap_replay() needs at least one recording file or directory")
        library = Library.load([str(r) for r in recordings], MatchOptions(tuple(ignore_fields), once=once))
        options = ServeOptions(Timing.parse(timing), parse_faults(fault), assign_ids)
        server = ServerThread(library, options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
