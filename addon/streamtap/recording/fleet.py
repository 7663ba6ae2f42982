"""Many recordings as one table in an embedded DuckDB: the report's figures and the Parquet index.

The table ``recordings`` has one row per recording (the columns of ``catalog.COLUMNS``). It is
loaded either from recording files (their header and end lines) or from an index folder
written by ``write_index`` (hive-style Parquet, partitioned by day and provider), which any
engine that reads Parquet reads unchanged.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import orjson

from .catalog import COLUMNS, Found, NotARecording, being_written, damaged_row, recording_row
from .reader import HeaderCut
from .writer import RecordingError

VERDICT_ORDER = ("complete", "stopped_by_limit", "filtered", "errored", "truncated", "corrupt", "unknown")
QUANTILES = (0.5, 0.95, 0.99)
TOP_REASONS = 10
PARQUET_GLOB = "day=*/provider=*/*.parquet"  # the layout write_index makes: other Parquet files are not the index


def connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")  # days and hours are UTC, whatever the machine's zone
    return con


@dataclass(slots=True)
class Loaded:
    rows: int = 0
    skipped: list[str] = field(default_factory=list)  # files found in folders that are not recordings, with why
    unreadable: list[str] = field(default_factory=list)  # folders that could not be searched, with why
    busy: list[str] = field(default_factory=list)  # recordings a live writer still holds (not read)


def read_rows(found: Iterable[Found], *, skip: set[str] = frozenset(), loaded: Loaded | None = None) -> list[dict[str, Any]]:
    """The rows of the recordings found, leaving out paths in ``skip`` and files being written.

    A named file that is not a recording, or is damaged, raises. In a folder, one that is not a
    recording (or cannot be read, or has a name that is not UTF-8) is skipped and noted; a damaged
    recording is a row that says what is wrong with it (listed, counted as not complete)."""
    loaded = loaded if loaded is not None else Loaded()
    rows = []
    seen = set(skip)  # a file given twice (by name and in its folder) is one recording
    for item in found:
        resolved = str(item.path)  # absolute already
        if item.unreadable:
            loaded.unreadable.append(f"{resolved}: {item.unreadable}")
            continue
        if resolved in seen:
            continue
        seen.add(resolved)
        try:
            resolved.encode()
        except UnicodeEncodeError:  # no engine could store the path, nor a user type it back
            if item.named:
                raise RecordingError(f"{resolved}: its name is not UTF-8; rename the file to report it") from None
            loaded.skipped.append(f"{resolved}: its name is not UTF-8")
            continue
        if ".partial.jsonl" in item.path.name and being_written(item.path):
            loaded.busy.append(resolved)
            continue
        try:
            rows.append(recording_row(item.path))
        except (NotARecording, OSError) as exc:
            if item.named:
                raise
            loaded.skipped.append(f"{item.path}: {exc}")
        except RecordingError as exc:
            if item.named:
                raise RecordingError(f"{item.path}: {exc}") from None
            rows.append(damaged_row(item.path, str(exc) if isinstance(exc, HeaderCut) else f"damaged: {exc}"))
    loaded.rows += len(rows)
    return rows


def load_rows(con: duckdb.DuckDBPyConnection, rows: list[dict[str, Any]], table: str = "recordings") -> None:
    """Create ``table`` from rows (through a temporary JSON-lines file: DuckDB's fastest way in)."""
    columns = {name: ("DOUBLE" if kind == "TIMESTAMPTZ" else "VARCHAR" if kind == "DATE" else kind) for name, kind in COLUMNS.items()}
    with tempfile.TemporaryDirectory(prefix="streamtap-") as tmp:
        source = Path(tmp) / "rows.jsonl"
        source.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
        select = ", ".join(
            f"to_timestamp({name}) AS {name}" if kind == "TIMESTAMPTZ" else f"CAST({name} AS DATE) AS {name}" if kind == "DATE" else name
            for name, kind in COLUMNS.items()
        )
        con.execute(
            f"CREATE OR REPLACE TABLE {table} AS SELECT {select} FROM read_json(?, format = 'newline_delimited', columns = ?)",
            [str(source), columns],
        )


def index_files(directory: Path) -> list[str]:
    return [str(p) for p in sorted(directory.glob(PARQUET_GLOB))]


def open_index(con: duckdb.DuckDBPyConnection, directory: Path, table: str = "recordings") -> int:
    """Table ``table`` loaded from an index folder (one scan of its files; every figure is then
    computed in memory); returns its row count (0 and an empty table when it has no files)."""
    if not index_files(directory):
        load_rows(con, [], table)
        return 0
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS {select_index([directory])}")
    return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def select_index(directories: list[Path]) -> str:
    """A SELECT of every row in the index folders (views cannot take parameters: the paths are quoted)."""
    globs = ", ".join(f"'{_sql_string(str(Path(d) / PARQUET_GLOB))}'" for d in directories)
    return f"SELECT {', '.join(COLUMNS)} FROM read_parquet([{globs}], hive_partitioning = true, union_by_name = true)"


def indexed_paths(con: duckdb.DuckDBPyConnection, directory: Path) -> set[str]:
    if not index_files(directory):
        return set()
    return {p for (p,) in con.execute("SELECT path FROM read_parquet(?)", [str(directory / PARQUET_GLOB)]).fetchall()}


def write_index(con: duckdb.DuckDBPyConnection, directory: Path, table: str = "new_rows") -> None:
    """Append ``table``'s rows to the index folder as new Parquet files, hive-partitioned by day
    and provider (existing files are never rewritten)."""
    directory.mkdir(parents=True, exist_ok=True)
    con.execute(
        f"COPY (SELECT * FROM {table} ORDER BY started) TO '{_sql_string(str(directory))}' "
        "(FORMAT PARQUET, PARTITION_BY (day, provider), APPEND, FILENAME_PATTERN 'recordings_{uuid}')"
    )


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
                "incomplete_files": incomplete_files,
                "ttft_ms": _quantiles(ttft),
                "duration_ms": _quantiles(duration),
            }
        )
    return out


def report(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Every figure of ``streamtap report`` from the table ``recordings``, as plain data."""
    total, first, last = con.execute("SELECT count(*), min(started), max(started) FROM recordings").fetchone()
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
            """SELECT path, started, provider, model, verdict, reason, stream_end, problem FROM recordings
               WHERE verdict IS DISTINCT FROM 'complete' OR NOT file_complete ORDER BY started, path"""
        ).fetchall()
    ]
    for item in incomplete:
        item["started"] = item["started"].isoformat() if item["started"] is not None else None
    return {
        "recordings": total,
        "judged": judged,
        "incomplete_files": con.execute("SELECT count(*) FROM recordings WHERE NOT file_complete").fetchone()[0],
        "first": first.isoformat() if first else None,
        "last": last.isoformat() if last else None,
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
    "Loaded",
    "NotARecording",
    "connect",
    "index_files",
    "indexed_paths",
    "load_rows",
    "open_index",
    "read_rows",
    "report",
    "select_index",
    "time_series",
    "ttft_values",
    "write_index",
]
