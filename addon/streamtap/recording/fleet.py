"""Many recordings as one table in an embedded DuckDB: the report's figures and the Parquet index.

The table ``recordings`` has one row per recording (the columns of ``catalog.COLUMNS``). It is
loaded either from recording files (their header and end lines) or from an index folder
written by ``write_index`` (hive-style Parquet, partitioned by day and provider), which any
engine that reads Parquet reads unchanged.
"""

from __future__ import annotations

import ctypes
import datetime
import errno
import fcntl
import glob
import os
import shutil
import tempfile
import uuid
import weakref
# DuckDB imports zoneinfo itself when a query first returns a timestamp with a zone, where a
# Ctrl-C interrupts that import and fails the query with an error of DuckDB's: it is loaded with
# DuckDB instead, which the verbs load with Ctrl-C held (cli.queries_stop_on_ctrl_c)
import zoneinfo  # noqa: F401
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import orjson

from .catalog import COLUMNS, Found, NotARecording, damaged_row, is_partial, recording_name, recording_row, unless_being_written
from .reader import HeaderCut
from .writer import RecordingError

VERDICT_ORDER = ("complete", "stopped_by_limit", "filtered", "errored", "truncated", "corrupt", "unknown")
QUANTILES = (0.5, 0.95, 0.99)
TOP_REASONS = 10
PARQUET_GLOB = "day=*/provider=*/*.parquet"  # the layout write_index makes: other Parquet files are not the index
# Inside the index folder, names that start with "." are no engine's data (Spark, Trino and Hive
# skip them, and this module's readers too): the lock of index runs, and the staging folder a
# run writes into before it moves each finished file to its partition.
INDEX_LOCK = ".streamtap-index.lock"
STAGING_PREFIX = ".staging-"
# A staged file is not named *.parquet, so that no reader's glob (DuckDB's `**` enters hidden
# folders) takes a file DuckDB is still writing.
STAGED_EXTENSION = "staged"
_syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)


_connections: weakref.WeakSet = weakref.WeakSet()  # every connection connect() made that is still alive


def connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")  # days and hours are UTC, whatever the machine's zone
    _connections.add(con)
    return con


def interrupt_queries() -> None:
    """Stop the query each open connection is running (from any thread): it raises DuckDB's
    InterruptException in the thread that runs it."""
    for con in list(_connections):
        try:
            con.interrupt()
        except duckdb.ConnectionException:  # closed already: nothing runs on it
            pass


@dataclass(slots=True)
class Loaded:
    rows: int = 0
    skipped: list[str] = field(default_factory=list)  # files found in folders that are not recordings, with why
    # folders that could not be searched and recordings that could not be read, with why: what
    # they hold is unknown
    unreadable: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)  # recordings a live writer still holds (not read)


def read_rows(found: Iterable[Found], *, skip: Collection[str] = frozenset(), loaded: Loaded | None = None) -> list[dict[str, Any]]:
    """``iter_rows`` as a list (a few recordings; the verbs stream them through ``load_rows``)."""
    return list(iter_rows(found, skip=skip, loaded=loaded))


def iter_rows(
    found: Iterable[Found], *, skip: Collection[str] = frozenset(), loaded: Loaded | None = None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """The rows of the recordings found, one at a time, leaving out paths in ``skip`` and files
    being written; ``progress`` is told the count of rows so far after each.

    A named file that is not a recording (or cannot be read) raises. In a folder, one that is not
    a recording (or cannot be read, or has a name that is not UTF-8) is skipped and noted; one
    named as a recording that cannot be read is noted as unreadable (its verdict is unknown). A
    damaged recording, named or found, is a row that says what is wrong with it (listed, counted
    as not complete)."""
    loaded = loaded if loaded is not None else Loaded()
    seen: set[str] = set()  # a file given twice (by name and in its folder) is one recording
    for item in found:
        resolved = str(item.path)  # absolute already
        if item.unreadable:
            loaded.unreadable.append(f"{resolved}: {item.unreadable}")
            continue
        if resolved in skip or resolved in seen:
            continue
        seen.add(resolved)
        try:
            resolved.encode()
        except UnicodeEncodeError:  # no engine could store the path, nor a user type it back
            which = "its name" if _not_utf8(item.path.name) else "a folder on its path"
            if item.named:
                raise RecordingError(f"{resolved}: {which} is not UTF-8; rename it to report the recording") from None
            loaded.skipped.append(f"{resolved}: {which} is not UTF-8")
            continue
        try:
            with unless_being_written(item.path) if is_partial(item.path) else nullcontext(True) as readable:
                if not readable:
                    loaded.busy.append(resolved)
                    continue
                row = recording_row(item.path)
        except (NotARecording, OSError) as exc:
            # named, a file that is none or is not there is the user's mistake; one that cannot be
            # read (permissions) is a recording like the others in the glob, whose report goes on
            if item.named and (isinstance(exc, (NotARecording, FileNotFoundError)) or _dangling(item.path)):
                raise
            # a file the proxy named, or any that could not be read (a recording copied or renamed,
            # another user's 0600 one): it may be a recording, so its verdict is unknown; only a
            # link that leads nowhere is plainly none
            if isinstance(exc, OSError) and (recording_name(item.path) or item.named):
                loaded.unreadable.append(f"{item.path}: cannot read this recording: {exc.strerror or exc}")
            elif isinstance(exc, OSError) and not _dangling(item.path):
                loaded.unreadable.append(f"{item.path}: cannot read this file, which may be a recording: {exc.strerror or exc}")
            else:
                loaded.skipped.append(f"{item.path}: {exc.strerror or exc}" if isinstance(exc, OSError) else f"{item.path}: {exc}")
            continue
        except RecordingError as exc:
            # a damaged recording (its name or first line says it is one) is listed, named or
            # found: one bad file in a shell glob of thousands must not cost the rest their report
            row = damaged_row(item.path, str(exc) if isinstance(exc, HeaderCut) else f"damaged: {exc}")
        loaded.rows += 1
        if progress is not None:
            progress(loaded.rows)
        yield row


def _dangling(path: Path) -> bool:
    """A link that leads nowhere: its target missing, under a file, or in a loop of links."""
    return path.is_symlink() and not os.path.exists(path)


def _not_utf8(name: str) -> bool:
    try:
        name.encode()
    except UnicodeEncodeError:
        return True
    return False


def load_rows(con: duckdb.DuckDBPyConnection, rows: Iterable[dict[str, Any]], table: str = "recordings") -> None:
    """Create ``table`` from rows (through a temporary JSON-lines file: DuckDB's fastest way in).
    Each row goes to the file as it comes: memory holds one, however many there are."""
    columns = {name: ("DOUBLE" if kind == "TIMESTAMPTZ" else "VARCHAR" if kind == "DATE" else kind) for name, kind in COLUMNS.items()}
    with tempfile.TemporaryDirectory(prefix="streamtap-") as tmp:
        source = Path(tmp) / "rows.jsonl"
        with source.open("wb") as lines:
            for row in rows:
                lines.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
        select = ", ".join(
            f"to_timestamp({name}) AS {name}" if kind == "TIMESTAMPTZ" else f"CAST({name} AS DATE) AS {name}" if kind == "DATE" else name
            for name, kind in COLUMNS.items()
        )
        con.execute(
            f"CREATE OR REPLACE TABLE {table} AS SELECT {select} FROM read_json(?, format = 'newline_delimited', columns = ?)",
            [str(source), columns],
        )


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))


def index_files(directory: Path) -> list[str]:
    """The index's Parquet files (the layout write_index makes), without hidden names."""
    return [
        str(p) for p in sorted(directory.glob(PARQUET_GLOB))
        if not any(_hidden(part) for part in p.relative_to(directory).parts)
    ]


def _literal(files: list[str]) -> list[str]:
    """The files as DuckDB patterns that match only themselves: DuckDB globs every path it is
    given, list items too, so a folder named idx[1] would read idx1 (and idx[1] none). A
    special character in brackets is that character alone; DuckDB's globber takes it so."""
    return [glob.escape(f) for f in files]


def open_index(con: duckdb.DuckDBPyConnection, directory: Path, table: str = "recordings") -> int:
    """Table ``table`` loaded from an index folder (one scan of its files; every figure is then
    computed in memory), without the rows of recordings replaced or copied since (``drop_stale``);
    returns its row count (0 and an empty table when it has no files)."""
    files = index_files(directory)
    if not files:
        load_rows(con, [], table)
        return 0
    check_index(con, files)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS {select_index([directory])}")
    drop_stale(con, table)
    return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


# How the proxy and `streamtap import` name a recording (writer.partial_name, writer.final_name),
# path and all: its folder and UTC start, the provider, the verdict once finished, the flow's part
_UNFINISHED_NAME = r"^(.*/\d{8}T\d{6}\.\d{3}Z)_[^_/]+_([^_/]+)\.partial\.jsonl(\.zst)?$"
_FINISHED_NAME = r"^(.*/\d{8}T\d{6}\.\d{3}Z)_[^_/]+_[^_/]+_([^_/]+)\.jsonl(\.zst)?$"


def drop_replaced(con: duckdb.DuckDBPyConnection, table: str = "recordings") -> None:
    """Remove from ``table`` the row of each ``.partial`` recording whose flow (same folder, start
    and flow part of the name) has a finished recording in it too: the finished one replaced it
    (an import run again removes a stopped import's unfinished file and imports the flow anew),
    yet an index keeps the row of every file it once read, and counted twice the flow would stay
    incomplete for good. The provider in the names is not compared, as the import does not:
    detection may settle on another one. A recording still being written is no row."""
    if not con.execute(f"SELECT count(*) FROM {table} WHERE path LIKE '%.partial.jsonl%'").fetchone()[0]:
        return  # as in most: no name read apart (1M rows: 0.04 s; 0.7 s when some are .partial)
    con.execute(
        f"""DELETE FROM {table} WHERE path IN (
            WITH unfinished AS (
                SELECT path, regexp_extract(path, '{_UNFINISHED_NAME}', ['start', 'flow']) AS flow FROM {table}
                WHERE path LIKE '%.partial.jsonl%' AND regexp_matches(path, '{_UNFINISHED_NAME}')),
            finished AS (  -- by the end of their names first: the pattern alone took 3.5 s over 1M rows
                SELECT regexp_extract(path, '{_FINISHED_NAME}', ['start', 'flow']) AS flow FROM {table}
                WHERE string_split(path, '_')[-1] IN (
                    SELECT flow.flow || suffix FROM unfinished, (VALUES ('.jsonl'), ('.jsonl.zst')) AS s(suffix))
                AND regexp_matches(path, '{_FINISHED_NAME}'))
            SELECT path FROM unfinished SEMI JOIN finished USING (flow))"""
    )


def drop_stale(con: duckdb.DuckDBPyConnection, table: str = "recordings") -> None:
    """The rows an index keeps that no longer count: a ``.partial`` replaced since, a copy's."""
    drop_replaced(con, table)
    drop_copies(con, table)


def drop_copies(con: duckdb.DuckDBPyConnection, table: str = "recordings") -> None:
    """Keep one row of each recording found under more than one path: the same flow, start and
    body (a folder of recordings moved or copied, and indexed again at its new place; an index
    keeps the row of every path it once read). The first path in order stays."""
    con.execute(
        f"""DELETE FROM {table} WHERE path IN (
            SELECT path FROM {table} WHERE flow_id IS NOT NULL AND started IS NOT NULL AND sha256 IS NOT NULL
            QUALIFY row_number() OVER (PARTITION BY flow_id, started, sha256 ORDER BY path) > 1)"""
    )


def drop_indexed_copies(con: duckdb.DuckDBPyConnection, directory: Path, table: str = "new_rows") -> int:
    """Remove from ``table`` (rows about to be indexed) each recording the index in ``directory``
    holds already under another path, or the table twice (``drop_copies``): an index read as it
    is, by Spark or Trino too, then counts it once. Returns how many rows went."""
    before = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    files = index_files(directory)
    if files:
        con.execute(
            f"""DELETE FROM {table} USING (
                SELECT DISTINCT flow_id, started, sha256 FROM read_parquet([{_file_list(files)}], union_by_name = true)
                WHERE flow_id IS NOT NULL AND started IS NOT NULL AND sha256 IS NOT NULL) AS indexed
            WHERE {table}.flow_id = indexed.flow_id AND {table}.started = indexed.started
              AND {table}.sha256 = indexed.sha256"""
        )
    drop_copies(con, table)
    return before - con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def _file_list(files: list[str]) -> str:
    """The files as the SQL list read_parquet takes (quoted: a view cannot take parameters)."""
    return ", ".join(f"'{_sql_string(f)}'" for f in _literal(files))


def select_index(directories: list[Path]) -> str:
    """A SELECT of every recording in the index folders, one row per path (views cannot take
    parameters: the paths are quoted). A path in two indexes, or twice in one, is the row of
    the first folder given, from its first file."""
    files = [f for d in directories for f in index_files(Path(d))]
    columns = [_PARTITION_COLUMNS.get(name, name) for name in COLUMNS]
    return (
        f"SELECT {', '.join(columns)} FROM read_parquet([{_file_list(files)}], filename = true, union_by_name = true) "
        "QUALIFY row_number() OVER (PARTITION BY path ORDER BY file_index) = 1"
    )


# day and provider from the two folders above each file, as write_index names them. DuckDB's own
# hive reading takes every key=value folder of the whole path: an index kept under a folder
# named provider=team-a gave every row that provider.
_PARTITION = "url_decode(regexp_extract(filename, '/day=([^/]*)/provider=([^/]*)/[^/]*$', {}))"
_PARTITION_COLUMNS = {
    "day": f"CAST({_PARTITION.format(1)} AS DATE) AS day",
    "provider": f"{_PARTITION.format(2)} AS provider",
}


def indexed_paths(con: duckdb.DuckDBPyConnection, directory: Path) -> set[str]:
    files = index_files(directory)
    if not files:
        return set()
    check_index(con, files)
    return {p for (p,) in con.execute("SELECT path FROM read_parquet(?)", [_literal(files)]).fetchall()}


# how the index's Parquet files store each of COLUMNS' types: (physical type, the converted types it
# may carry); day and provider come from the folders
_STORED_AS: dict[str, tuple[str, set[str | None]]] = {
    "TIMESTAMPTZ": ("INT64", {"TIMESTAMP_MICROS"}),
    "VARCHAR": ("BYTE_ARRAY", {"UTF8"}),
    "INTEGER": ("INT32", {"INT_32", None}),
    "BIGINT": ("INT64", {"INT_64", None}),
    "DOUBLE": ("DOUBLE", {None}),
    "BOOLEAN": ("BOOLEAN", {None}),
}


def check_index(con: duckdb.DuckDBPyConnection, files: list[str]) -> None:
    """Raise (a duckdb error, which callers turn into "not a streamtap index") unless every file
    holds every column, stored as the index stores it, in a day folder that names a date: one
    that does not would stop a report halfway, and Spark or Trino cannot read files of two
    types as one table."""
    stored: dict[str, dict[str, tuple[str, str | None]]] = {}
    for file_name, column, physical, converted in con.execute(
        f"SELECT file_name, name, type, converted_type FROM parquet_schema([{_file_list(files)}]) WHERE type IS NOT NULL"
    ).fetchall():
        stored.setdefault(file_name, {})[column] = (physical, converted)
    for file_name, columns in stored.items():
        for column, kind in COLUMNS.items():
            if column in _PARTITION_COLUMNS:
                continue
            physical, converted = columns.get(column, (None, None))
            wanted, conversions = _STORED_AS[kind]
            if physical != wanted or converted not in conversions:
                found = "missing" if physical is None else f"stored as {physical}" + (f" ({converted})" if converted else "")
                raise duckdb.InvalidInputException(f"{file_name}: column {column} is {found}, not {kind}")
    # the day comes from the folder, as the report reads it: one that names no date would stop it
    undated = con.execute(
        f"SELECT filename FROM (SELECT unnest(?::VARCHAR[]) AS filename) WHERE TRY_CAST({_PARTITION.format(1)} AS DATE) IS NULL LIMIT 1",
        [files],
    ).fetchone()
    if undated is not None:
        raise duckdb.InvalidInputException(f"{undated[0]}: its day folder names no date")


class IndexLock:
    """One ``streamtap index`` run at a time in an index folder: each reads the paths indexed
    and adds the others, so two at once would both add the same recordings. Held from before
    the read until the new files are in place; a killed run's lock goes with its process."""

    def __init__(self, directory: Path, waiting: Callable[[], None]) -> None:
        """Take the lock (creating the folder), calling ``waiting`` once if another run holds it."""
        self.directory = directory
        self.path = directory / INDEX_LOCK
        told = False
        while True:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not told:
                    waiting()
                    told = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            # the run before removed the lock file as it let go (release): a lock on a file no
            # longer in the folder would keep out no one
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            held = os.fstat(fd)
            if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
                self._fd = fd
                return
            os.close(fd)

    def release(self, remove_folder: bool = False) -> None:
        """Drop the lock, removing its file (the folder keeps only the index; a run waiting on
        the removed file takes the lock afresh); with ``remove_folder``, the folder too if
        nothing else is in it (a run that made the folder and added nothing leaves none)."""
        try:
            self.path.unlink(missing_ok=True)
            if remove_folder:
                try:
                    self.directory.rmdir()
                except OSError:
                    pass  # something else is in it: it stays
        finally:
            os.close(self._fd)


def remove_staging(directory: Path) -> None:
    """Remove the staging folders a killed run left (call it holding the IndexLock: a live
    run's staging folder is its work in progress). Their files never reached the index, so
    their recordings are not in it: this run adds them."""
    for entry in directory.iterdir():
        if entry.name.startswith(STAGING_PREFIX) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)


def write_index(con: duckdb.DuckDBPyConnection, directory: Path, table: str = "new_rows") -> None:
    """Add ``table``'s rows to the index folder as new Parquet files, hive-partitioned by day
    and provider (existing files are never rewritten); call it holding the IndexLock.

    DuckDB writes them into a hidden staging folder; each finished file is then synced and
    renamed into its partition (one file system: the rename is atomic), so a reader never sees
    a file half written. A run killed meanwhile leaves whole files in the index and the rest in
    its staging folder, which the next run removes (remove_staging), adding their recordings."""
    directory.mkdir(parents=True, exist_ok=True)
    staging = directory / f"{STAGING_PREFIX}{uuid.uuid4().hex}"
    try:
        con.execute(
            f"COPY (SELECT * FROM {table} ORDER BY started) TO '{_sql_string(str(staging))}' "
            "(FORMAT PARQUET, PARTITION_BY (day, provider), FILENAME_PATTERN 'recordings_{uuid}', "
            f"FILE_EXTENSION '{STAGED_EXTENSION}')"
        )
        staged_files = sorted(staging.rglob(f"*.{STAGED_EXTENSION}"))
        _sync_all(staged_files, directory)  # every file's bytes on disk before its name says it is whole
        partitions = set()
        for staged in staged_files:
            partition = directory / staged.parent.relative_to(staging)
            partition.mkdir(parents=True, exist_ok=True)
            os.rename(staged, partition / (staged.stem + ".parquet"))
            partitions.add(partition)
        _sync_all(partitions, directory)  # the renames themselves
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _sync_all(paths: Iterable[Path], folder: Path) -> None:
    """Make ``paths`` (files and folders inside ``folder``) durable. Where the C library has
    Linux's ``syncfs``, one call on ``folder``'s file system does it: it costs what is waiting to
    be written, not a journal commit per path (an index run over 3,650 partitions: 0.15 s against
    about 1.5 s). Elsewhere each path is synced."""
    if _syncfs is not None:
        fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _syncfs(fd) != 0:
                number = ctypes.get_errno()
                raise OSError(number, f"syncfs: {os.strerror(number)}", str(folder))
        finally:
            os.close(fd)
        return
    for path in paths:
        _sync(path)


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # a file system that cannot sync (a folder, on some) has nothing to lose
            raise
    finally:
        os.close(fd)


def _sql_string(text: str) -> str:
    return text.replace("'", "''")


# --- the report ---------------------------------------------------------------------------


def _verdict_counts(con, where: str = "TRUE", params: list | None = None) -> dict[str, int]:
    counts = dict(
        con.execute(
            f"SELECT verdict, count(*) FROM recordings WHERE verdict IS NOT NULL AND ({where}) GROUP BY verdict", params or []
        ).fetchall()
    )
    ordered = {kind: counts.pop(kind) for kind in VERDICT_ORDER if kind in counts}
    ordered.update(sorted(counts.items()))
    return ordered


def _quantiles(values: list[float | None] | None) -> dict[str, float | None]:
    values = values or [None] * len(QUANTILES)
    return {f"p{round(q * 100)}": (round(v, 3) if v is not None else None) for q, v in zip(QUANTILES, values)}


def _breakdown(con, keys: list[str]) -> list[dict[str, Any]]:
    """Verdict counts and rates, TTFT and duration quantiles, per distinct value of ``keys``."""
    group = ", ".join(keys)
    rows = con.execute(
        f"""
        SELECT {group}, count(*) AS recordings,
               list(verdict) FILTER (WHERE verdict IS NOT NULL) AS verdicts,
               quantile_cont(ttft_ms, {list(QUANTILES)}) AS ttft,
               quantile_cont(duration_ms, {list(QUANTILES)}) AS duration,
               count(*) FILTER (WHERE NOT file_complete) AS incomplete_files
        FROM recordings GROUP BY {group} ORDER BY {group}
        """
    ).fetchall()
    out = []
    for row in rows:
        values = dict(zip(keys, row))
        recordings, verdicts, ttft, duration, incomplete_files = row[len(keys) :]
        counts: dict[str, int] = {}
        for kind in verdicts or []:
            counts[kind] = counts.get(kind, 0) + 1
        counts = {kind: counts[kind] for kind in (*VERDICT_ORDER, *sorted(set(counts) - set(VERDICT_ORDER))) if kind in counts}
        judged = sum(counts.values())
        out.append(
            {
                **{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in values.items()},
                "recordings": recordings,
                "verdicts": counts,
                "rates": {kind: round(n / judged, 4) for kind, n in counts.items()} if judged else {},
                "not_complete_rate": round(1 - counts.get("complete", 0) / judged, 4) if judged else None,
                # cut, damaged or without a verdict: with the verdict counts, every recording of the group
                "not_judged": recordings - judged,
                "incomplete_files": incomplete_files,
                "ttft_ms": _quantiles(ttft),
                "duration_ms": _quantiles(duration),
            }
        )
    return out


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _utc_text(microseconds: int | None) -> str | None:
    """A time DuckDB gave as microseconds since the epoch, as ISO 8601 in UTC (+00:00)."""
    return None if microseconds is None else (_EPOCH + datetime.timedelta(microseconds=microseconds)).isoformat()


def report(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Every figure of ``streamtap report`` from the table ``recordings``, as plain data."""
    # times come out as microseconds, not as timestamps with a zone: DuckDB makes those with
    # zoneinfo, which needs a time-zone database that Windows, Alpine and slim images lack
    total, first, last = con.execute("SELECT count(*), epoch_us(min(started)), epoch_us(max(started)) FROM recordings").fetchone()
    verdicts = _verdict_counts(con)
    judged = sum(verdicts.values())
    stream_end = dict(
        con.execute(
            "SELECT stream_end, count(*) FROM recordings WHERE stream_end IS NOT NULL GROUP BY stream_end ORDER BY count(*) DESC, stream_end"
        ).fetchall()
    )
    ttft, duration = con.execute(
        f"SELECT quantile_cont(ttft_ms, {list(QUANTILES)}), quantile_cont(duration_ms, {list(QUANTILES)}) FROM recordings"
    ).fetchone()
    reasons = [
        {"verdict": verdict, "reason": reason, "count": count}
        for verdict, reason, count in con.execute(
            f"""SELECT verdict, reason, count(*) AS n FROM recordings
                WHERE verdict IS NOT NULL AND verdict <> 'complete'
                GROUP BY verdict, reason ORDER BY n DESC, verdict, reason LIMIT {TOP_REASONS}"""
        ).fetchall()
    ]
    incomplete = [
        dict(zip(("path", "started", "provider", "model", "verdict", "reason", "stream_end", "problem"), row))
        for row in con.execute(
            """SELECT path, epoch_us(started), provider, model, verdict, reason, stream_end, problem FROM recordings
               WHERE verdict IS DISTINCT FROM 'complete' OR NOT file_complete ORDER BY started, path"""
        ).fetchall()
    ]
    for item in incomplete:
        item["started"] = _utc_text(item["started"])
    return {
        "recordings": total,
        "judged": judged,
        "incomplete_files": con.execute("SELECT count(*) FROM recordings WHERE NOT file_complete").fetchone()[0],
        "first": _utc_text(first),
        "last": _utc_text(last),
        "verdicts": verdicts,
        "rates": {kind: round(n / judged, 4) for kind, n in verdicts.items()} if judged else {},
        "stream_end": stream_end,
        "ttft_ms": _quantiles(ttft),
        "duration_ms": _quantiles(duration),
        "by_provider": _breakdown(con, ["provider"]),
        "by_model": _breakdown(con, ["provider", "model"]),
        "by_day": _breakdown(con, ["day"]),
        "by_day_provider_model": _breakdown(con, ["day", "provider", "model"]),
        "reasons": reasons,
        "incomplete": incomplete,
    }


def time_series(con: duckdb.DuckDBPyConnection) -> tuple[str, list[dict[str, Any]]]:
    """Verdict counts per provider per time bucket, for the charts: ("day" or "hour", rows)."""
    span = con.execute("SELECT epoch(max(started)) - epoch(min(started)) FROM recordings").fetchone()[0] or 0
    bucket, seconds = ("day", 86400) if span > 2 * 86400 else ("hour", 3600)
    rows = con.execute(
        f"""SELECT CAST(floor(epoch(started) / {seconds}) * {seconds} AS BIGINT) AS t, provider, verdict, count(*)
            FROM recordings WHERE verdict IS NOT NULL GROUP BY ALL ORDER BY t, provider, verdict"""
    ).fetchall()
    return bucket, [{"t": t, "provider": p, "verdict": v, "count": n} for t, p, v, n in rows]


def ttft_values(con: duckdb.DuckDBPyConnection) -> list[tuple[str, float]]:
    return con.execute("SELECT provider, ttft_ms FROM recordings WHERE ttft_ms IS NOT NULL ORDER BY provider").fetchall()


__all__ = [
    "PARQUET_GLOB",
    "VERDICT_ORDER",
    "IndexLock",
    "Loaded",
    "NotARecording",
    "connect",
    "drop_replaced",
    "index_files",
    "indexed_paths",
    "iter_rows",
    "load_rows",
    "open_index",
    "read_rows",
    "remove_staging",
    "report",
    "select_index",
    "time_series",
    "ttft_values",
    "write_index",
]
