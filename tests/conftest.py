"""Shared test helpers.

`../shared/` (real captures and the provider-stream notes) sits beside the clone in
development and CI, never beside a user's clone: tests that read it skip, saying why,
where it is absent. Nothing from it is copied into the project.
"""

from __future__ import annotations

import compileall
import os
from pathlib import Path

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("STREAMTAP_SHARED", REPO.parent / "shared"))
FIXTURES = SHARED / "fixtures"

settings.register_profile("default", max_examples=200, deadline=None)
settings.register_profile("ci", max_examples=200, deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


def pytest_sessionstart(session) -> None:
    # Where PYTHONDONTWRITEBYTECODE is set (as on this project's machines), every mitmdump, analysis
    # worker and CLI process the tests start would compile streamtap from source again, ~0.15 s
    # each and ~10% of the suite's time. Compiling once here writes the bytecode they then read.
    compileall.compile_dir(REPO / "addon", quiet=1)


def shared_path(*parts: str) -> Path:
    """A path under ../shared/, or skip the calling test with the reason."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: ../shared/ exists beside a development or CI clone only")
    return path


def shared_files(pattern: str) -> list[Path]:
    """Files under ../shared/fixtures matching a glob; empty when shared/ is absent."""
    if not FIXTURES.is_dir():
        return []
    return sorted(FIXTURES.glob(pattern))


def chunked(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def compiled_loops_missing() -> str:
    """Why this install has no compiled decoder loops (streamtap/wire/_accel.c)."""
    from streamtap.wire import accel

    if accel.pure_python_asked:
        return "STREAMTAP_PURE_PYTHON is set: the decoders run their Python loops"
    return (
        "streamtap.wire._accel is not built: reinstall with a C compiler and zlib's headers "
        "(`make .venv/.installed` after `rm .venv/.installed`), or set STREAMTAP_PURE_PYTHON=1 to test the Python loops alone"
    )


def feed_cycled(decoder, stream: bytes, chunks: list[int] | None = None) -> list:
    """Every event a wire decoder gives for ``stream`` fed in pieces of the given sizes (cycled), or whole,
    then closed."""
    out: list = []
    if chunks is None:
        out += decoder.feed(stream)
    else:
        pos = i = 0
        while pos < len(stream):
            size = chunks[i % len(chunks)]
            out += decoder.feed(stream[pos : pos + size])
            pos += size
            i += 1
    out += decoder.close()
    return out


# --- skip reasons, one line each -------------------------------------------------------------
# pytest's -rs prints one line per skipped test location and path, so a clone without
# ../shared/ would get ~150 near-identical lines. Instead each reason is printed once with
# its count (addopts asks for -rfExX: every report but skips); `-rs` still lists them all.

SHARED_ABSENT = "../shared/ is absent (the team's captured provider streams, beside a development or CI clone only)"


def skip_reason(report: pytest.TestReport) -> str:
    """A skip's reason, with every path under ../shared/ folded into one reason."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    if str(SHARED) in reason or "../shared/" in reason:
        return SHARED_ABSENT
    if reason.startswith("got empty parameter set") and not FIXTURES.is_dir():
        return SHARED_ABSENT  # a parametrization over shared_files(): nothing to run without them
    return reason


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    counts: dict[str, int] = {}
    for report in skipped:
        reason = skip_reason(report)
        counts[reason] = counts.get(reason, 0) + 1
    terminalreporter.section(f"{len(skipped)} skipped, by reason", sep="-")
    for reason, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        terminalreporter.line(f"{count:5d}  {reason}")
