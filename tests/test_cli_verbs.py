"""The `streamtap` command imports only the chosen verb's module; `--help` still lists every verb,
every verb's own `--help` and work are unchanged, and an unknown verb is a usage error.
Real processes, the installed console script."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamtap.cli import VERBS

STREAMTAP = Path(sys.executable).with_name("streamtap")
DEMO = Path(__file__).resolve().parents[1] / "addon" / "streamtap" / "data" / "demo"

# prints, at exit, the streamtap.commands modules (and DuckDB) the process imported
PROBE = (
    "import sys, atexit\n"
    "atexit.register(lambda: print('IMPORTED', sorted(m for m in sys.modules if m.startswith('streamtap.commands.')"
    " or m == 'duckdb'), file=sys.stderr))\n"
)


def probed(code: str, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    result = subprocess.run([sys.executable, "-c", PROBE + code, *args], capture_output=True, text=True, timeout=60)
    line = next(x for x in result.stderr.splitlines() if x.startswith("IMPORTED "))
    return result, json.loads(line.removeprefix("IMPORTED ").replace("'", '"'))


def imported(*args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    return probed("from streamtap.cli import main\nsys.exit(main())", *args)


def streamtap(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(STREAMTAP), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def test_top_level_help_lists_every_verb_with_its_line_and_imports_none():
    result, modules = imported("--help")
    assert result.returncode == 0
    listed = re.findall(r"^    (\S+)", result.stdout, re.M)
    assert listed == list(VERBS)
    squeezed = "".join(result.stdout.split())  # argparse wraps lines, also at hyphens
    for verb, (_, help_line) in VERBS.items():
        assert "".join(help_line.split()) in squeezed, verb
    assert modules == []


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_each_verb_imports_only_its_own_module(verb):
    result, modules = imported(verb, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: streamtap {verb} ")
    # what the verb's module brings in by itself (some verbs share helpers), and nothing more
    module = VERBS[verb][0]
    assert module in modules
    assert modules == probed(f"import {module}")[1]
    assert len(modules) < len(VERBS) - 1


def test_report_help_teaches_without_loading_duckdb():
    result, modules = imported("report", "--help")
    for word in ("--json", "--csv", "--html FILE", "--limit N", "PATH"):
        assert word in result.stdout
    assert modules == ["streamtap.commands.report"]  # DuckDB is loaded by a report, not by its help


@pytest.mark.parametrize("argv", [["bogus"], ["repot", "x.jsonl"], ["--no-such-option"], []])
def test_an_unknown_verb_or_none_is_a_usage_error(argv):
    result = streamtap(*argv)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    if argv and argv[0] != "--no-such-option":
        assert "invalid choice" in result.stderr and "report" in result.stderr


def test_the_verbs_still_work(tmp_path):
    recordings = sorted(DEMO.glob("*.jsonl"))
    assert recordings, f"no demo recordings in {DEMO}"
    complete = next(p for p in recordings if p.name.endswith("_complete.jsonl"))

    addon = streamtap("addon")
    assert addon.returncode == 0 and Path(addon.stdout.strip()).is_file()

    verify = streamtap("verify", complete)
    assert verify.returncode == 0 and ": complete (" in verify.stdout
    assert streamtap("verify", *recordings).returncode == 1  # two of them were cut

    show = streamtap("show", complete)
    assert show.returncode == 0 and "complete" in show.stdout

    report = streamtap("report", "--json", DEMO)
    assert report.returncode == 1, report.stderr  # not all complete
    counts = json.loads(report.stdout)["verdicts"]
    assert sum(counts.values()) == len(recordings) and counts["truncated"] == 2

    index = streamtap("index", DEMO, "--out", tmp_path / "index")
    assert index.returncode == 0, index.stderr
    assert list((tmp_path / "index").rglob("*.parquet"))
    from_index = streamtap("report", "--json", tmp_path / "index")
    assert json.loads(from_index.stdout)["verdicts"] == counts

    for verb in ("import", "serve", "sweep", "show", "verify", "report"):
        missing = streamtap(verb, tmp_path / "no-such-file.jsonl")
        assert missing.returncode == 2, (verb, missing.stdout, missing.stderr)
        assert "Traceback" not in missing.stderr
