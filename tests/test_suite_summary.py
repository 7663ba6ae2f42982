"""The suite's own report: skips are summed up by reason, one line each, with ../shared/
paths folded into one reason (a clone without ../shared/ skips ~150 tests for it)."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

TESTS = '''
import pytest
from conftest import shared_files, shared_path


@pytest.mark.parametrize("name", ["a.sse", "b.bin", "c/d.ndjson"])
def test_reads_a_capture(name):
    shared_path("fixtures", name)


@pytest.mark.parametrize("path", shared_files("*.sse"))
def test_every_capture(path):
    pass


@pytest.mark.parametrize("n", [1, 2])
def test_needs_a_tool(n):
    pytest.skip("frobnicate is not installed")


def test_runs():
    pass
'''


def test_skips_are_counted_per_reason_in_one_line_each(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("STREAMTAP_SHARED", str(tmp_path / "no-shared-here"))
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_skips=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rfExX")
    result.assert_outcomes(passed=1, skipped=6)
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*6 skipped, by reason*",
        "    4  ../shared/ is absent (the team's captured provider streams, beside a development or CI clone only)",
        "    2  frobnicate is not installed",
    ])
    assert "no-shared-here" not in out  # no per-path line
    assert out.count("is absent") == 1
