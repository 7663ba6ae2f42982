"""Shared test helpers.

`../shared/` (real captures and the provider-stream notes) sits beside the clone in
development and CI, never beside a user's clone: tests that read it skip, saying why,
where it is absent. Nothing from it is copied into the project.
"""

from __future__ import annotations

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
