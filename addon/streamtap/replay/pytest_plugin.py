"""pytest plugin (entry point ``streamtap``): replay recordings, with faults, inside tests.

Fixture ``streamtap_replay``: a function that starts a replay server on a free loopback
port for one or more recordings (optional ``fault=``, ``timing=``, ``assign_ids=``,
``once=``, ``ignore_fields=``) and returns it (``.base_url``, ``.served`` with each
answered request and its fault log). Every server it started stops when the test ends.
Marker ``streamtap_faults(*specs)``: run the test once per fault spec (``None``: no fault) of
every such marker on it (a module's ``pytestmark`` and the test's own); the fixture applies the
current one, also available as the ``streamtap_fault`` fixture.

A complete example (``weather.jsonl``: an answer that begins "The weather" and then calls a
tool, as a model answering with text and a tool call does, recorded by the Tap, or by
``streamtap import``, in the test file's folder: relative recording paths resolve there,
whatever the current directory; ``cut:at=tool-args`` needs the tool call)::

    import openai
    import pytest

    class IncompleteAnswer(Exception):  # the app's own verdict: the answer did not finish
        pass

    def answer(client):
        text, finish = [], None
        try:
            for chunk in client.chat.completions.create(
                model="gpt-4.1-nano", messages=[{"role": "user", "content": "Weather in Paris?"}], stream=True
            ):
                for choice in chunk.choices:
                    text.append(choice.delta.content or "")
                    finish = choice.finish_reason or finish
        except openai.APIConnectionError as exc:  # the connection broke mid-answer
            raise IncompleteAnswer(f"connection broken: {exc}") from exc
        if finish is None:  # a clean cut: the SDK ends the loop as if the answer were whole
            raise IncompleteAnswer("the stream ended without a finish_reason")
        return "".join(text)

    def client_for(server):
        return openai.OpenAI(base_url=server.base_url + "/v1", api_key="test", max_retries=0)

    def test_full_answer(streamtap_replay):
        assert answer(client_for(streamtap_replay("weather.jsonl"))).startswith("The weather")

    @pytest.mark.streamtap_faults("cut:event=5,style=clean", "cut:at=tool-args,style=abort")
    def test_cut_answers_are_refused(streamtap_replay):
        client = client_for(streamtap_replay("weather.jsonl"))
        with pytest.raises(IncompleteAnswer):
            answer(client)

A fault that does not fit a recording the server holds (``cut:at=tool-args`` on an answer
without a tool call, ``cut:event=99`` on a 20-event stream) fails the test when the server
starts, with the reason: it is never served as an HTTP error that ``pytest.raises`` could mistake for
the failure under test. Several faults (``;``) are checked together, as the server applies
them: ``error:kind=openai,after=3;cut:event=20`` does not fit a 20-event stream, since the
error ends it after event 3.

This module is loaded by every pytest run in an environment where streamtap is
installed, so it imports nothing heavy at import time and never fails there.
"""

from __future__ import annotations

from pathlib import Path
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
    markers = list(metafunc.definition.iter_markers(MARKER))
    if not markers or _marker_misuse(markers):
        return  # pytest_runtest_setup fails this test alone: raised here, it would stop the whole collection
    specs = list(dict.fromkeys(spec for marker in markers for spec in marker.args))  # a module's and a test's own
    metafunc.fixturenames.append("streamtap_fault")
    metafunc.parametrize("streamtap_fault", specs, ids=[s or "no-fault" for s in specs])


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    problem = _marker_misuse(list(item.iter_markers(MARKER)))
    if problem is None and _param_markers(item):
        # (a pytest.param's marks reach the item after the test was parametrized)
        if "streamtap_fault" in getattr(item, "callspec").params:
            problem = (f"@pytest.mark.{MARKER} on a pytest.param cannot be combined with one on the test, its "
                       "class or its module: give each case its fault on one of them")
        elif len([spec for marker in _param_markers(item) for spec in marker.args]) != 1:
            problem = (f"@pytest.mark.{MARKER} on a pytest.param takes one fault spec (or None): the case is "
                       "already one test; give several specs on the test to run it once per spec")
    if problem:
        pytest.fail(problem, pytrace=False)


def _param_markers(item: Any) -> list[pytest.Mark]:
    """The marker given in a pytest.param's marks, which parametrization does not see."""
    callspec = getattr(item, "callspec", None)
    return [mark for mark in (callspec.marks if callspec is not None else []) if mark.name == MARKER]


def _marker_misuse(markers: list[pytest.Mark]) -> str | None:
    for marker in markers:
        if not marker.args:
            return f"@pytest.mark.{MARKER} needs at least one fault spec (or None)"
        for spec in marker.args:
            if spec is not None and not isinstance(spec, str):
                return (f"@pytest.mark.{MARKER} takes fault specs as separate strings (or None), "
                        f"not {type(spec).__name__} {spec!r}")
        if marker.kwargs:
            return f"@pytest.mark.{MARKER} takes no keyword arguments, not {', '.join(marker.kwargs)}"
    return None


@pytest.fixture
def streamtap_fault(request: pytest.FixtureRequest) -> str | None:
    """The current fault spec (set by the streamtap_faults marker; None otherwise)."""
    marked = _param_markers(request.node)  # (one spec: pytest_runtest_setup refuses any other number)
    return marked[0].args[0] if marked else None


@pytest.fixture
def streamtap_replay(request: pytest.FixtureRequest, streamtap_fault: str | None):
    """A factory: ``streamtap_replay(*recordings, fault=..., timing="fast", assign_ids=False, once=False,
    ignore_fields=())`` -> a running server with ``.base_url``. Relative recording paths resolve
    against the test file's folder; a fault that does not fit one of the recordings fails the test
    here, before the client runs. ``ignore_fields``: request body fields left out of matching, a
    tuple of names, or one name as a str (``"model"`` is the field ``model``)."""
    from streamtap.replay.faults import FaultSpecError, Timing, parse_faults
    from streamtap.replay.match import Library, MatchOptions
    from streamtap.replay.server import ServeOptions, ServerThread
    from streamtap.replay.source import RecordingError

    started: list[Any] = []
    beside_test = Path(request.path).parent

    def start(
        *recordings: Any,
        fault: str | None = streamtap_fault,
        timing: str = "fast",
        assign_ids: bool = False,
        once: bool = False,
        ignore_fields: tuple[str, ...] | str = (),
    ):
        if not recordings:
            raise TypeError("streamtap_replay() needs at least one recording file or directory")
        if fault is not None and not isinstance(fault, str):  # parse_faults would fail inside, on a list's item
            pytest.fail(f"streamtap_replay: fault= takes one spec string (several joined with ';') or None, "
                        f"not {type(fault).__name__} {fault!r}", pytrace=False)
        if not isinstance(timing, str):
            pytest.fail(f"streamtap_replay: timing= takes a string (fast, original or scale=N), not "
                        f"{type(timing).__name__} {timing!r}", pytrace=False)
        paths = [beside_test / Path(r) for r in recordings]  # an absolute path stays as it is
        # tuple("model") would be the fields m, o, d, e, l
        fields = (ignore_fields,) if isinstance(ignore_fields, str) else tuple(ignore_fields)
        try:
            library = Library.load(paths, MatchOptions(fields, once=once))
            faults = parse_faults(fault)
            for swap in (f for f in faults if f.kind == "swap-tail"):
                # a path in a fault resolves as the recordings do, never against the current directory:
                # beside the test, else beside the served recordings (as the server looks)
                name = Path(swap.params["with"])
                places = [beside_test / name] + [Path(entry.source.path).parent / name for entry in library.entries]
                swap.params["with"] = str(next((place for place in places if place.is_file()), beside_test / name))
            options = ServeOptions(Timing.parse(timing), faults, assign_ids)
            if not library.entries:
                raise RecordingError(f"no recordings (*.jsonl) in {', '.join(map(str, paths))}")
            server = ServerThread(library, options).start()  # it loads (and checks) what swap-tail names
            started.append(server)
            _check_faults_fit(server.server, faults)
        except (RecordingError, FaultSpecError) as exc:
            problem = str(exc)
        else:
            return server
        # outside the except clause, so the report is this one line, not a chained traceback
        pytest.fail(f"streamtap_replay: {problem}", pytrace=False)

    yield start
    for server in started:
        server.stop()


def _check_faults_fit(server: Any, faults: list) -> None:
    """The faults must fit every recording the server holds, planned together as the server
    plans each answer (an error event or a dropped one moves the positions after it): a
    request matching one they do not fit would get an HTTP 400, and a test expecting a
    failure would pass for that."""
    from streamtap.replay.faults import FaultSpecError, plan

    misfits = []
    for entry in server.library.entries:
        try:
            # the body as served (with assign_ids, its id lines count for byte=); the recordings
            # that swap-tail names, as the server loaded them
            plan(server.served_source(entry.source), faults, server.options.timing, others=server.swap_recordings)
        except FaultSpecError as exc:
            misfits.append(f"{Path(entry.source.path).name}: {exc}")
    if misfits:
        raise FaultSpecError(f"a fault does not fit the recording ({'; '.join(misfits)}); serve only recordings it fits")
