"""`streamtap index PATH... --out DIR`: one Parquet row per recording, partitioned by day and provider.

The folder is hive-style (``DIR/day=2026-11-30/provider=openai-chat/*.parquet``), so DuckDB,
Spark, Trino and Athena read it as it is. A run adds only the recordings the index does not
hold yet (by path), in new files: existing files are never rewritten. One run at a time holds
the folder (a second waits), and a file appears in it only whole (see fleet.write_index).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from streamtap.cli import EXIT_FINDING, EXIT_OK, Progress, UsageError, named_path, queries_stop_on_ctrl_c, say
from streamtap.recording import RecordingError

from .report import not_an_index, warn

# Left in an index folder that holds no Parquet file yet, so that a run which added nothing (it
# found only recordings still being written) leaves an index `report` reads, as 0 recordings.
# Its name starts with ".": no engine takes it for data. The first files replace it.
INDEX_MARK = ".streamtap-index"
_MARK_TEXT = b"This folder is a streamtap index: Parquet files under day=*/provider=*/ (files named .* or _* are no data).\n"


EPILOG = """\
Run it again to add new recordings: rows already indexed (same path) are skipped.
`streamtap report DIR` reads the index too. To query it with DuckDB, which streamtap
installs as a Python module (the duckdb command-line tool is separate), run with the
Python streamtap is installed in:

  python -c "import duckdb; duckdb.sql(\\"SELECT verdict, count(*) FROM read_parquet('DIR/**/*.parquet', hive_partitioning=true) GROUP BY ALL\\").show()"

Exit codes: 0 done, 1 a folder or a recording could not be read (those recordings are
not indexed), 2 usage error (no recordings under the paths, among them).
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("paths", nargs="+", type=named_path, metavar="PATH", help="recordings or folders of recordings (searched recursively)")
    parser.add_argument("--out", required=True, metavar="DIR", help="the index folder (created if missing)")


def run(args: argparse.Namespace) -> int:
    with queries_stop_on_ctrl_c():  # which loads DuckDB first, with Ctrl-C held
        return _index(args)


def _index(args: argparse.Namespace) -> int:
    import duckdb

    from streamtap.recording import fleet  # DuckDB: imported by this verb only
    from streamtap.recording.catalog import find_recordings, missing

    if not args.out:
        raise UsageError("--out: give the index folder (an empty name would index into the current folder)")
    out = Path(args.out)
    if "\\" in str(out):
        # DuckDB's writer takes a backslash for a folder separator on every system, and would
        # write elsewhere or fail; a folder whose name holds one is still read as named
        raise UsageError(f"--out {out}: DuckDB, which writes the index, takes a backslash in the path for a folder separator; "
                         "name a path without one (for a folder whose name has one, cd into it and give --out relative)")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: not a folder")
    for raw in args.paths:
        if missing(raw):  # one that cannot be looked at is there: its reading names it, and the run goes on
            raise UsageError(f"{raw}: no such file or directory")
        if Path(raw).resolve() == out.resolve():
            raise UsageError(f"{raw} is the index folder itself; give the recordings")
    started = time.perf_counter()
    try:
        found = list(find_recordings(args.paths))
    except (RecordingError, OSError) as exc:
        raise UsageError(str(exc)) from None
    if not found:  # said before --out is made: a mistyped folder leaves nothing behind
        raise UsageError(f"no recordings under {' '.join(args.paths)}")
    con = fleet.connect()
    created = not out.exists()

    def waiting() -> None:
        say("index", f"another index run holds {out}; waiting for it to finish")

    try:
        lock = fleet.IndexLock(out, waiting)
    except OSError as exc:
        raise UsageError(f"--out {out}: {exc.strerror or exc}") from None
    succeeded = False
    try:
        try:
            fleet.remove_staging(out)  # a killed run's unfinished files
        except OSError as exc:
            raise UsageError(f"--out {out}: cannot remove a killed run's staging folder: {exc.strerror or exc}") from None
        try:  # read under the lock: a run that held it before has added its recordings by now
            known = fleet.indexed_paths(con, out)
        except duckdb.Error as exc:
            raise UsageError(f"--out {not_an_index([out], exc)}") from None
        loaded = fleet.Loaded()
        rows = fleet.iter_rows(found, skip=known, loaded=loaded, progress=Progress("index", "recordings read"))
        try:
            fleet.load_rows(con, rows, "new_rows")  # read as they are written to DuckDB's file, never all at once
        except (RecordingError, OSError) as exc:  # a named file that is not a recording (a damaged one is a row)
            raise UsageError(str(exc)) from None
        warn(loaded, "index")
        if not (loaded.rows or loaded.unreadable or loaded.busy or any(str(item.path) in known for item in found)):
            raise UsageError(f"no recordings under {' '.join(args.paths)}")  # a mistyped folder, as for report
        try:
            copies = fleet.drop_indexed_copies(con, out, "new_rows")  # moved or copied since they were indexed
        except duckdb.Error as exc:
            raise UsageError(f"--out {not_an_index([out], exc)}") from None
        if loaded.rows - copies:
            try:
                fleet.write_index(con, out, "new_rows")
            except OSError as exc:
                raise UsageError(f"--out {out}: {exc.strerror or exc}") from None
            except duckdb.Error as exc:  # the folder cannot be written (DuckDB says so in its own words)
                raise UsageError(f"--out {out}: cannot write the index: {str(exc).strip().splitlines()[0]}") from None
        try:
            mark_if_empty(out, has_files=bool(fleet.index_files(out)))
        except OSError as exc:
            raise UsageError(f"--out {out}: {exc.strerror or exc}") from None
        succeeded = True
    finally:
        # a failed run that made the folder leaves none (also when Ctrl-C stopped the write); a
        # run that succeeded leaves its index, empty too, for the next step to read
        lock.release(remove_folder=created and not succeeded)
    elsewhere = f", {copies} already under another path" if copies else ""
    say("index", f"{loaded.rows - copies} new recording(s) indexed, {len(known)} already in {out}{elsewhere} "
                 f"({time.perf_counter() - started:.2f} s)")
    return EXIT_FINDING if loaded.unreadable else EXIT_OK  # those recordings (and the ones in those folders) are not in it


def mark_if_empty(folder: Path, has_files: bool) -> None:
    """Leave the INDEX_MARK in an index without files; remove it from one that has them (the
    folder keeps only the index, and its layout says what it is)."""
    mark = folder / INDEX_MARK
    if has_files:
        mark.unlink(missing_ok=True)
        return
    try:
        fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        return
    try:
        os.write(fd, _MARK_TEXT)
    finally:
        os.close(fd)
