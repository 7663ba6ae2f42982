"""The cut sweep: which cuts does a client swallow without a word?

For each cut position of a recording (every event boundary, the protocol-aware positions,
sampled byte offsets) and each end style, a fresh replay server serves the recording cut
there, the client command runs against it (base URL in the environment), and the run is
classified:

- ``noticed``: the client exited non-zero; or it exited 0 without handing on the answer the
  cut stream delivered and said why (error text in its output);
- ``silent``: exit 0 with the partial answer printed as its answer, or nothing said: partial
  output silently accepted (the dangerous case). An error word printed beside the answer (or
  inside it: a model may well write "error") does not count as noticing;
- ``hung``: still running at the timeout (killed);
- ``crashed``: killed by a signal, or could not start (exit 126 or 127: what a shell or
  ``env`` says when it cannot run the command it was given);
- ``whole``: exit 0, but the cut left a stream streamtap judges complete: nothing partial to
  accept;
- ``inconclusive``: what would be ``noticed``, when the client did not succeed even uncut (the
  baseline run): its failure says nothing about the cut.

``sweep_positions`` and ``classify`` are pure; ``run_sweep`` is the asyncio runner.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from streamtap.recording import RecordingError, check_recording, read_recording

from .faults import FaultSpecError, Timing, judging, parse_fault, plan, protocol_positions, unfit_faults
from .match import Library, MatchOptions
from .server import ReplayServer, ServeOptions
from .source import Source


class SweepStopped(Exception):
    """The sweep was cancelled (Ctrl-C, SIGTERM, SIGHUP) after its clients' runs were ended:
    ``report`` holds the runs that had finished, which are not to be lost with the rest."""

    def __init__(self, report: SweepReport) -> None:
        super().__init__(f"stopped after {len(report.runs)} of {report.planned} runs")
        self.report = report


class ClientNotStarted(Exception):
    """The client command could not be started even for the first run (a script without a #!
    line, a missing interpreter): every cut run would only say "crashed"."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


NOTICED, SILENT, HUNG, CRASHED = "noticed", "silent", "hung", "crashed"
WHOLE, INCONCLUSIVE = "whole", "inconclusive"
OUTCOMES = (SILENT, HUNG, CRASHED, NOTICED, WHOLE, INCONCLUSIVE)
ERROR_TEXT = r"(?i)\b(error|exception|traceback|truncated|incomplete|interrupted|failed)\b"
# one of those words as the name of a field that holds nothing (``error=None``, ``"error": null``,
# an SDK object's repr or a JSON result printed whole): it says no error happened
_EMPTY_FIELD = re.compile(
    r"""(?im)\b(?:error|exception|traceback|truncated|incomplete|interrupted|failed)["']?\s*[=:]\s*"""
    r"""(?:None|null|nil|false|""|''|\[\]|\{\})(?=\s*(?:[,;)}\]]|$))"""
)
DEFAULT_POSITIONS = "events,protocol,bytes=16"


def sweep_positions(source: Source, which: str = DEFAULT_POSITIONS) -> list[str]:
    """Cut points as fault-spec prefixes (``cut:event=3``, ``cut:at=tool-args``, ``cut:byte=812``).

    ``which`` is a comma list of: ``events`` (after every event but the last, and before the
    first), ``protocol`` (each protocol-aware position the stream has), ``bytes=K`` (K byte
    offsets spread evenly over the body, off the event boundaries), or explicit
    ``event=N`` / ``byte=N`` / ``at=NAME`` items; one that the recording does not have (an
    event past its end, a tool-args cut without a tool call), or an item off that grammar
    (``events=5``, ``bytes=``), is a FaultSpecError.

    Items that cut at the same byte serve the same bytes: they are one position, named by the
    most telling of them with the others after it (``cut:at=before-terminal (cut:event=21)``;
    ``position_spec`` reads the spec back).
    """
    events = [f for f in source.frames if f.seq is not None]
    body_length = sum(len(f.raw) for f in source.frames)
    frame_ends, event_ends, pos = set(), [], 0
    for f in source.frames:
        pos += len(f.raw)
        frame_ends.add(pos)
        if f.seq is not None:
            event_ends.append(pos)
    inner_ends = sorted(o for o in frame_ends if 0 < o < body_length)
    out: list[str] = []
    offsets: dict[str, int] = {}  # where each listed cut falls in the body
    asked: list[str] = []
    for item in filter(None, (w.strip() for w in which.split(","))):
        name, equals, value = item.partition("=")
        if name in ("events", "protocol"):
            if equals:  # events=5 is not "event 5": said, not run as every event
                one = "event=N" if name == "events" else "at=NAME"
                raise FaultSpecError(f"--positions: {item!r}: {name} takes no value (for one cut: {one})")
            if name == "events":
                cuts = {f"cut:event={n}": (event_ends[n] if n >= 0 else 0) for n in range(-1, len(events) - 1)}
            else:
                cuts = {f"cut:at={p}": o for p, o, _w in protocol_positions(source)}
            out += cuts
            offsets |= cuts
        elif name == "bytes":
            if not value:
                raise FaultSpecError(f"--positions: {item!r} needs a count: bytes=K")
            count = _int(item, value)
            if count < 0:
                raise FaultSpecError(f"--positions: {item!r} needs a count of 0 or more")
            inside = body_length - 1 - len(inner_ends)  # offsets 1..length-1 that are no frame's end
            count = min(count, inside)  # more than that picks every one of them
            if inside > 0 and count > 0:
                step = inside / count
                picked = sorted({_nth_inside(int(i * step + step / 2), inner_ends) for i in range(count)})
                cuts = {f"cut:byte={o}": o for o in picked}
                out += cuts
                offsets |= cuts
        elif name in ("event", "byte", "at"):
            if not value:
                raise FaultSpecError(f"--positions: {item!r} needs a value: {name}={'NAME' if name == 'at' else 'N'}")
            asked.append(f"cut:{name}={value}")
            out.append(asked[-1])
        else:
            raise FaultSpecError(f"--positions takes events, protocol, bytes=K, event=N, byte=N, at=NAME; not {item!r}")
    seen: set[str] = set()
    unique = [p for p in out if not (p in seen or seen.add(p))]
    # a bad explicit item fails here, before any run; every run would get the server's HTTP 400
    asked_faults = [parse_fault(spec) for spec in asked]
    # (a cut at the very end, in any style, first: the plan refuses only one that changes nothing at all)
    unfit = _uncut_ends(asked_faults, event_ends, body_length) or unfit_faults(asked_faults, [source])
    if unfit:
        raise FaultSpecError(f"--positions: {'; '.join(unfit)}")
    for spec, fault in zip(asked, asked_faults):  # they fit: each cuts where the plan ends the body
        offsets.setdefault(spec, len(plan(source, [fault]).body))
    return _one_per_cut(unique, offsets)


# the most telling name of a cut first: what it cuts before, then which event, then a byte
_NAME_RANK = ("cut:at=", "cut:event=", "cut:byte=")


def _one_per_cut(specs: list[str], offsets: dict[str, int]) -> list[str]:
    """``specs`` with those that cut at the same byte made one label (every style serves
    the same bytes for them: one run each, not two counted apart), in the place of the name
    it goes by."""
    same_cut: dict[int, list[str]] = {}
    for spec in specs:
        same_cut.setdefault(offsets[spec], []).append(spec)
    labels: dict[str, str] = {}
    for names in same_cut.values():
        first, *others = sorted(names, key=lambda spec: next(i for i, p in enumerate(_NAME_RANK) if spec.startswith(p)))
        labels[first] = f"{first} ({', '.join(others)})" if others else first
    return [labels[spec] for spec in specs if spec in labels]


def position_spec(position: str) -> str:
    """The fault spec of a ``sweep_positions`` label (its first name)."""
    return position.split(" (", 1)[0]


def _uncut_ends(faults: list, event_ends: list[int], body_length: int) -> list[str]:
    """Why each of ``faults`` that cuts at the very end is no cut: the client would get the
    whole stream, and a client that rightly accepts it would be counted silent (the automatic
    ``events`` list stops before the last event for this reason). The last event is a cut when
    bytes follow it (a JSON array's closing bracket)."""
    ends = []
    last = len(event_ends) - 1
    for fault in faults:
        if fault.params.get("byte") == body_length:
            ends.append(f"{fault.spec!r}: byte {body_length} is the end of the body: nothing would be cut")
        elif event_ends and "at" not in fault.params and fault.params.get("event") == last and event_ends[last] == body_length:
            ends.append(f"{fault.spec!r}: event {last} is the last event: nothing would be cut")
    return ends


def _nth_inside(n: int, inner_ends: list[int]) -> int:
    """The n-th (from 0) body offset that is not a frame's end, without listing every offset."""
    offset = n + 1
    for end in inner_ends:
        if end > offset:
            break
        offset += 1
    return offset


def _int(item: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise FaultSpecError(f"--positions: {item!r} needs a number") from None


MIN_ANSWER_CHARS = 12  # a shorter answer is not told apart from an error message that quotes it
ANSWER_PROBE_CHARS = 200


def classify(
    returncode: int | None, output: str, *, timed_out: bool, error_text: str | None = None, answer: str = "", complete: bool = False
) -> str:
    """One run's outcome. ``answer``: the text the (cut) stream delivered. ``error_text``: a user's
    own pattern; any match in an exit-0 run's output then counts as noticed. ``complete``: the
    cut stream is still judged complete, so an exit 0 accepted no partial output."""
    if timed_out:
        return HUNG
    # The client is exec'd directly, not through a shell: a signal shows as a negative
    # returncode, and any status it exits with (255 from sys.exit(-1) too) is its own answer.
    # 126 and 127 are what a launcher (sh -c, env) exits with when it cannot run the command.
    if returncode is None or returncode < 0 or returncode in (126, 127):
        return CRASHED
    if returncode != 0:
        return NOTICED
    if complete:
        return WHOLE
    if error_text is not None:
        return NOTICED if re.search(error_text, output) else SILENT
    if carries_answer(output, answer):
        return SILENT  # exit 0 with the partial answer handed on: whatever else it printed, it accepted it
    return NOTICED if re.search(ERROR_TEXT, _EMPTY_FIELD.sub("", output)) else SILENT


def carries_answer(output: str, answer: str) -> bool:
    """Whether ``output`` holds the answer (its first half, up to 200 characters, whitespace
    folded), as text or escaped as a JSON string or a Python repr holds it: the client printed
    what the stream delivered as its result."""
    if len(" ".join(answer.split())) < MIN_ANSWER_CHARS:
        return False
    output = " ".join(output.split())
    written = {answer, json.dumps(answer)[1:-1], json.dumps(answer, ensure_ascii=False)[1:-1], repr(answer)[1:-1]}
    for form in written:
        form = " ".join(form.split())
        if form[: min(ANSWER_PROBE_CHARS, max(MIN_ANSWER_CHARS, len(form) // 2))] in output:
            return True
    return False


# Of a client's output, the first and the last this many bytes are kept: enough for every check
# (the answer's first 200 characters, an error message), and a client that prints without end
# costs no more memory than this
OUTPUT_KEPT = 256 * 1024
OUTPUT_DRAIN_SECONDS = 1.0


class _Output:
    """A client's output as it comes: its head and its tail, what lies between counted."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.left_out = 0
        self.ended = asyncio.Event()

    def take(self, fd: int) -> None:
        """The pipe is readable: what it holds, or its end."""
        if self.ended.is_set():
            return
        try:
            data = os.read(fd, 64 * 1024)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # (an ended pipe stays readable: no more calls)
            asyncio.get_running_loop().remove_reader(fd)
            self.ended.set()
            return
        room = OUTPUT_KEPT - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > OUTPUT_KEPT:
            excess = len(self.tail) - OUTPUT_KEPT
            del self.tail[:excess]
            self.left_out += excess

    def text(self) -> str:
        between = f"\n[... {self.left_out} bytes of output left out ...]\n" if self.left_out else ""
        return self.head.decode("utf-8", "replace") + between + self.tail.decode("utf-8", "replace")


@dataclass(slots=True)
class Run:
    position: str
    style: str
    outcome: str
    returncode: int | None
    seconds: float
    fault_log: list[str] = field(default_factory=list)
    output_tail: str = ""
    verdict: str | None = None  # what streamtap's verdict layer says of the stream this client got
    requested: bool = True  # the client asked the replay server for the answer: else it never met the cut

    @property
    def spec(self) -> str:
        return f"{position_spec(self.position)},style={self.style}"


@dataclass(slots=True)
class SweepReport:
    recording: str
    command: list[str]
    baseline: Run | None
    runs: list[Run]
    seconds: float
    planned: int  # the cut runs asked for: more than ``runs`` holds when the sweep was stopped

    @property
    def baseline_failed(self) -> bool:
        """The client failed on the whole, uncut answer (a non-zero exit, an error said, a hang):
        then a cut run's failure is no sign that it noticed the cut."""
        return self.baseline is not None and not baseline_succeeded(self.baseline)

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(OUTCOMES, 0)
        for run in self.runs:
            counts[run.outcome] += 1
        return counts

    def to_dict(self) -> dict:
        return {
            "recording": self.recording,
            "command": self.command,
            "seconds": round(self.seconds, 3),
            "counts": self.counts(),
            "baseline": asdict(self.baseline) if self.baseline else None,
            "baseline_failed": self.baseline_failed,
            "planned": self.planned,
            "runs": [asdict(r) | {"spec": r.spec} for r in self.runs],
        }

    def table(self) -> str:
        styles = sorted({r.style for r in self.runs}, key=["clean", "abort", "reset"].index)
        by = {(r.position, r.style): r for r in self.runs}
        positions = list(dict.fromkeys(r.position for r in self.runs))
        width = max([len("cut position")] + [len(p) for p in positions])
        cell = max([8] + [len(_mark(r.outcome)) for r in self.runs])
        lines = ["  ".join([f"{'cut position':<{width}}", *[f"{s:<{cell}}" for s in styles]]).rstrip()]
        for p in positions:
            cells = [_mark(by[(p, s)].outcome) if (p, s) in by else "-" for s in styles]
            lines.append("  ".join([f"{p:<{width}}", *[f"{c:<{cell}}" for c in cells]]).rstrip())
        counts = self.counts()
        lines.append("")
        rare = "".join(f", {counts[o]} {o}" for o in (WHOLE, INCONCLUSIVE) if counts[o])
        lines.append(
            f"{len(self.runs)} runs in {self.seconds:.1f} s: {counts[SILENT]} silently accepted partial output, "
            f"{counts[NOTICED]} noticed, {counts[HUNG]} hung, {counts[CRASHED]} crashed{rare}"
        )
        if self.baseline_failed and self.baseline.outcome == INCONCLUSIVE:
            lines.append(
                f"inconclusive: without any cut the client (exit {self.baseline.returncode}) never asked the replay server "
                "for the answer, so no run shows what it does with a cut: have it send its request to $STREAMTAP_BASE_URL "
                "(or read OPENAI_BASE_URL, ANTHROPIC_BASE_URL or AWS_ENDPOINT_URL_BEDROCK_RUNTIME, which the sweep sets)"
            )
        elif self.baseline_failed:
            fix = ("the recording is an error answer, which a client may well fail on: sweep a recording of a "
                   "whole answer" if self.baseline.verdict == "errored" else "fix the client or its environment first")
            lines.append(
                f"inconclusive: without any cut the client was {self.baseline.outcome} (exit {self.baseline.returncode}), "
                f"so its failures do not show that it noticed the cuts: {fix}"
            )
        return "\n".join(lines)


def baseline_succeeded(baseline: Run) -> bool:
    """The uncut run went as a working client's should: exit 0, the whole answer taken."""
    return baseline.outcome in (SILENT, WHOLE)


def _mark(outcome: str) -> str:
    return {SILENT: "SILENT", NOTICED: "noticed", HUNG: "HUNG", CRASHED: "CRASHED", WHOLE: "whole", INCONCLUSIVE: "inconclusive"}[outcome]


RUN_MARK = "STREAMTAP_SWEEP_RUN"  # in each client's environment, naming its run: what it starts inherits it


def client_env(base_url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        STREAMTAP_BASE_URL=base_url,
        OPENAI_BASE_URL=base_url + "/v1",
        ANTHROPIC_BASE_URL=base_url,
        AWS_ENDPOINT_URL_BEDROCK_RUNTIME=base_url,
    )
    # a local replay never needs real credentials: never send the user's to it
    env.update(
        OPENAI_API_KEY="sk-streamtap-replay",
        ANTHROPIC_API_KEY="sk-ant-streamtap-replay",
        AWS_ACCESS_KEY_ID="AKIDSTREAMTAPREPLAY",
        AWS_SECRET_ACCESS_KEY="streamtap-replay",
        AWS_DEFAULT_REGION=env.get("AWS_DEFAULT_REGION", "us-east-1"),
    )
    for other in ("AWS_SESSION_TOKEN", "ANTHROPIC_AUTH_TOKEN", "AWS_BEARER_TOKEN_BEDROCK"):  # sent besides, or instead
        env.pop(other, None)
    env.update(extra or {})
    return env


async def run_sweep(
    source: Source,
    command: list[str],
    *,
    positions: list[str],
    styles: tuple[str, ...] = ("clean", "abort"),
    timing: Timing | None = None,
    timeout: float = 20.0,
    jobs: int | None = None,
    error_text: str | None = None,
    progress: Callable[[int, int, dict[str, int]], None] | None = None,
) -> SweepReport:
    timing = timing or Timing()
    jobs = max(1, jobs or os.cpu_count() or 1)
    gate = asyncio.Semaphore(jobs)
    start = time.monotonic()
    counts = dict.fromkeys(OUTCOMES, 0)
    done = 0
    work = [(p, s) for p in positions for s in styles]

    baseline: Run | None = None

    async def one(spec: str | None, position: str, style: str) -> Run:
        nonlocal done
        async with gate:
            run = await _run_once(source, command, spec, position, style, timing, timeout, error_text)
        if spec is not None:
            if run.outcome == NOTICED and not baseline_succeeded(baseline):
                run.outcome = INCONCLUSIVE  # it fails uncut too: a wrong import, a missing variable
            done += 1
            counts[run.outcome] += 1
            if progress:
                progress(done, len(work), counts)
        return run

    finished: dict[int, Run] = {}

    async def cut_run(index: int, position: str, style: str) -> None:
        finished[index] = await one(f"{position_spec(position)},style={style}", position, style)

    def report() -> SweepReport:
        runs = [finished[index] for index in sorted(finished)]  # in the table's order, whatever ended first
        return SweepReport(source.path, command, baseline, runs, time.monotonic() - start, len(work))

    try:
        baseline = await one(None, "no cut", "-")
        if progress:
            progress(0, len(work), counts)
        await asyncio.gather(*(cut_run(index, p, s) for index, (p, s) in enumerate(work)))
    except asyncio.CancelledError:  # gather ended every run first, their clients killed
        raise SweepStopped(report()) from None
    return report()


async def _run_once(
    source: Source, command: list[str], spec: str | None, position: str, style: str, timing: Timing, timeout: float, error_text: str | None
) -> Run:
    faults = [parse_fault(spec)] if spec else []
    mark = os.urandom(8).hex()
    server = ReplayServer(Library([source], MatchOptions(match_any=True)), ServeOptions(timing, faults), log=lambda line: None)
    await server.start("127.0.0.1", 0)
    started = time.monotonic()
    # The output goes to a pipe of our own, not asyncio's: asyncio's wait() waits for its pipes to
    # close too, and a process the client leaves behind holding its stdout would keep the run waiting
    output = _Output()
    loop = asyncio.get_running_loop()
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    loop.add_reader(read_end, output.take, read_end)
    try:
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=write_end,
                stderr=asyncio.subprocess.STDOUT,
                env=client_env(server.base_url, {RUN_MARK: mark}),
                start_new_session=True,  # so a hung client's children die with it
            )
        finally:
            os.close(write_end)
    except OSError as exc:
        loop.remove_reader(read_end)
        os.close(read_end)
        await server.close()
        if spec is None:  # the first run, without any cut: no cut run is started for a client that cannot be
            raise ClientNotStarted(exc) from exc
        return Run(position, style, CRASHED, None, 0.0, [], f"cannot start {command[0]}: {exc}")
    timed_out = False
    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        timed_out = True
    finally:
        # what is left of the client's session ends with its run; on Ctrl-C (cancelled)
        # too, since the client's own session does not get the SIGINT
        _kill_group(proc)
        _kill_marked(mark)
        await proc.wait()
        await server.close()
        try:  # what the client wrote before it ended (a process it left that escaped holds the pipe: not waited for)
            await asyncio.wait_for(output.ended.wait(), OUTPUT_DRAIN_SECONDS)
        except TimeoutError:
            pass
        finally:
            loop.remove_reader(read_end)
            os.close(read_end)
    text = output.text()
    verdict, answer = _judge(source, faults)
    # the baseline is no cut: taking its whole answer is what it is there to show
    complete = spec is not None and verdict == "complete"
    outcome = classify(proc.returncode, text, timed_out=timed_out, error_text=error_text, answer=answer, complete=complete)
    requested = bool(server.served)
    # whatever it did, it was not the cut stream's doing; uncut, a failure is still the client's to fix
    if not requested and outcome in ((SILENT, NOTICED, WHOLE) if spec is not None else (SILENT, WHOLE)):
        outcome = INCONCLUSIVE
    fault_log = [line for served in server.served for line in served.log]
    return Run(position, style, outcome, proc.returncode, time.monotonic() - started, fault_log, text[-400:], verdict, requested)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone (its number may be another's now)
        pass


def _kill_marked(mark: str) -> None:
    """Kill what the client started that left its session (a daemon: setsid, double fork), out of
    reach of its process group: every process whose environment names this run. Each is opened
    as a pidfd and its environment read again before the signal, so a number that a new process
    took meanwhile is never signalled. Linux only (elsewhere there is no /proc to read); a process
    that cleared its environment escapes."""
    needle = f"\0{RUN_MARK}={mark}\0".encode()
    try:
        entries = [entry.name for entry in os.scandir("/proc") if entry.name.isdigit()]
    except OSError:
        return
    for pid in entries:
        if _marked(pid, needle):
            try:
                handle = os.pidfd_open(int(pid))
            except OSError:  # gone already
                continue
            try:
                if _marked(pid, needle):
                    signal.pidfd_send_signal(handle, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(handle)


def _marked(pid: str, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return needle in b"\0" + environ.read()
    except OSError:  # gone, or another user's
        return False


JUDGED_SLICE = 64 * 1024  # the served body is judged in pieces of this size, as a live read would come


def _judge(source: Source, faults: list) -> tuple[str | None, str]:
    """streamtap's verdict on the stream the client got, and the answer it carried (text, else
    the tool calls' argument strings)."""
    served = plan(source, faults)  # the positions were checked to fit before any run
    body = served.body
    try:
        from streamtap.providers import Dialect, StreamEnd, StreamSession

        # judged as `streamtap verify` judges the recording: with its own framing and status (a
        # Gemini JSON array read as SSE, or an HTTP error read as a 200, would be judged cut or
        # corrupt even whole), and the sentinel, event size limit and streamed flag it was
        # recorded with (without its sentinel, an answer that lacks it would pass as complete)
        session = StreamSession(Dialect(source.dialect), source.wire, keep_arrivals=False,
                                one_response=True, **judging(source))  # one HTTP response, as the client got it
        for at in range(0, len(body), JUDGED_SLICE):
            session.feed(body[at : at + JUDGED_SLICE])
        # as the client's body ended: an abort or a reset is no clean end, whatever bytes came before it
        # (the SDKs that read a last line without its line end read it only at a clean end)
        analysis = session.close(StreamEnd.FINISHED if served.end.style == "clean" else StreamEnd.UPSTREAM_RESET)
    except Exception:  # an unknown dialect string, or the verdict layer missing: the sweep still reports
        return None, ""
    turn = analysis.turn
    answer = turn.text() or "".join(call.arguments_raw or "" for call in turn.tool_calls())
    return str(analysis.verdict.kind), answer


def recording_problems(source: Source) -> list[str]:
    """Why the runs would not cut a whole, sound answer: what ``streamtap verify`` finds wrong
    with the file (incomplete, damaged; found when it was loaded with ``check=True``, else read
    again now), and a stream that is cut or corrupt already uncut."""
    if source.problems is not None:
        problems = list(source.problems)
    else:
        try:
            problems = check_recording(read_recording(source.path))
        except (RecordingError, OSError) as exc:  # it loaded a moment ago; changed since
            problems = [str(exc)]
    verdict, _answer = _judge(source, [])
    if verdict in ("truncated", "corrupt"):
        problems.append(f"served uncut, its stream is already {verdict}")
    elif verdict == "errored":
        problems.append(f"served uncut, its stream is an error answer ({verdict}): a client that raises on the "
                        "provider's error fails without any cut, and the runs are then inconclusive")
    return problems


def progress_bar(stream) -> Callable[[int, int, dict[str, int]], None]:
    """A one-line progress bar on ``stream`` (stderr), redrawn in place."""

    def draw(done: int, total: int, counts: dict[str, int]) -> None:
        width = 30
        filled = int(width * done / total) if total else width
        stream.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}  silent {counts[SILENT]}  "
            f"noticed {counts[NOTICED]}  hung {counts[HUNG]}  crashed {counts[CRASHED]}"
            + "".join(f"  {o} {counts[o]}" for o in (WHOLE, INCONCLUSIVE) if counts[o])
        )
        if done == total:
            stream.write("\n")
        stream.flush()

    return draw
