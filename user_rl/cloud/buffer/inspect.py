"""`user-rl buffer inspect`: what a buffer directory holds, and whether its segments read back intact.

Strictly read-only: the index is opened read-only (a closed buffer as an immutable file, so SQLite
creates no -wal/-shm files next to it), segment files are only read, and a commit log is parsed
without cutting its torn tail. It works while a learner is writing the directory: the index is
read in one snapshot, a segment evicted meanwhile counts as evicted, and a sealed file that is
not (yet) in the index is reported, not failed.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from user_rl.cloud.buffer.commitlog import CommitLog
from user_rl.cloud.buffer.index import BufferIndex, EpisodeRecord, StreamRecord
from user_rl.cloud.buffer.rows import KIND_RECORD
from user_rl.cloud.buffer.segment import CorruptSegment, read_segment
from user_rl.cloud.buffer.who import by_name, count_rows, format_who, new_counts, table, total
from user_rl.wire.transitions import ACTOR_PERSON, IDLE, LABEL_PERSON

INDEX = "index.sqlite"
EPISODE_STATUSES = ("terminated", "truncated", "open")
_SEALED = re.compile(r"seg-(\d+)\.seg")
_OPEN = re.compile(r"open-(\d+)\.(seg|log)")


def inspect_buffer(directory: Path, verify: bool = True) -> dict[str, Any]:
    """A JSON-ready summary of the buffer at `directory`; `ok` is False when a segment is corrupt.

    With `verify`, every sealed segment's column checksums are recomputed; without it only its
    header and size are checked. FileNotFoundError (naming the path) when there is no buffer.
    """
    directory = Path(directory)
    if not directory.exists():
        raise FileNotFoundError(f"no buffer directory at {directory}")
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a buffer directory")
    listing = _list_files(directory)  # before the snapshot: a file sealed in between is then indexed
    snap = _read_index(directory / INDEX)

    checks, corrupt = _check_segments(directory, snap, listing, verify)
    segments = snap["segments"]
    by_status = Counter(s.status for s in segments.values())
    usable = [s for s in segments.values() if s.status == "ok"]
    robots = _robots(snap)
    episodes = snap["episodes"]
    ep_status = Counter(e.status for e in episodes)
    labelled = [e.success for e in episodes if e.success is not None]
    finished = [e for e in episodes if e.status != "open"]
    unindexed = [c for c in checks if c["segment"] not in segments]
    open_segments = _open_segments(directory, listing)

    lengths, intact, who = _scan_segments(directory, snap, checks)
    mismatches = _episode_length_mismatches(snap, lengths, intact)
    problems = [f"CORRUPT {c['path']}: {c['reason']} ({c['detail']})" for c in corrupt]
    problems += [
        f"EPISODE LENGTH robot {m['robot']} epoch {m['epoch']} episode {m['episode']}: the index says "
        f"{m['index_length']} steps ({m['status']}{', ' + m['end_reason'] if m['end_reason'] else ''}), "
        f"its segments hold {m['segment_rows']}"
        for m in mismatches
    ]
    notes = [
        f"UNINDEXED {c['path']}: a sealed segment the index does not list (a crash between sealing and "
        f"indexing, recovered at the next start, or a learner sealing it right now); it reads back "
        f"{c['status'] if c['status'] == 'ok' else 'CORRUPT'}"
        for c in unindexed
    ]
    notes += [
        f"OPEN {', '.join(o['files'])}: {o['committed_batches']} committed batches "
        f"({o['committed_records']} records) not yet sealed (a learner is writing them, or a crash "
        f"left them: the next start seals them)"
        for o in open_segments
    ]
    return {
        "directory": str(directory),
        "ok": not corrupt and not mismatches,
        "verified": verify,
        "format": snap["meta"].get("format"),
        "segment_rows": int(snap["meta"]["segment_rows"]) if snap["meta"].get("segment_rows") else None,
        "spaces": _spaces(snap["meta"].get("spaces")),
        "segments": {
            "indexed": len(segments),
            "ok": sum(1 for c in checks if c["status"] == "ok" and c["segment"] in segments),
            "corrupt": sum(1 for c in corrupt if c["segment"] in segments),
            "evicted": by_status.get("evicted", 0),
            "unindexed": [c["file"] for c in unindexed],
            "open": open_segments,
            "checks": checks,
        },
        "rows": sum(s.rows for s in usable),
        "records": sum(s.records for s in usable),
        "transitions": sum(s.transitions for s in usable),
        "records_evicted": sum(s.records for s in segments.values() if s.status == "evicted"),
        "records_corrupt": sum(s.records for s in segments.values() if s.status not in ("ok", "evicted")),
        "batches": sum(r["batches"] for r in robots.values()),
        "lost_batches": snap["lost"],
        "bytes": _sizes(directory, listing),
        "robots": {name: {**r, "who": who.get(name, new_counts())} for name, r in robots.items()},
        "who": total(who),
        "tasks": _tasks(snap),
        "episodes": {
            "total": len(episodes),
            **{status: ep_status.get(status, 0) for status in EPISODE_STATUSES},
            **{status: n for status, n in ep_status.items() if status not in EPISODE_STATUSES},
            "cut_short": sum(e.end_reason == "edge_restart" for e in episodes),  # truncated by an edge restart
            "labelled": len(labelled),
            "mean_length": _mean([e.length for e in finished]),
            "mean_return": _mean([e.ret for e in finished]),
        },
        "success_rate": _mean(labelled),
        "interventions": sum(e.interventions for e in episodes),
        "corrupt": corrupt,
        "episode_length_mismatches": mismatches,
        "problems": problems,
        "notes": notes,
    }


# -- the index --------------------------------------------------------------------------------------


def _wal(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def _open_index(path: Path) -> BufferIndex:
    index = BufferIndex(path, read_only=True)  # raises FileNotFoundError naming the path
    if not _wal(path).exists():
        # No writer and a clean close: a read-only connection to a WAL database would create
        # -wal/-shm files and leave them behind. The file is read as it is instead (the
        # connection above has not touched the disk yet: sqlite opens lazily).
        index.db.close()
        index.db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True, check_same_thread=False)
    return index


def _read_index(path: Path) -> dict[str, Any]:
    """Everything from the index in one read transaction (one consistent snapshot)."""
    for _ in range(3):
        had_wal = _wal(path).exists()
        index = _open_index(path)
        try:
            index.db.execute("BEGIN")
            snap = {
                "meta": dict(index.db.execute("SELECT key, value FROM meta")),
                "segments": {s.id: s for s in index.segments(status=None)},
                "streams": index.streams(),
                "episodes": index.episodes(),
                "batches": {
                    int(stream): (int(n), int(records or 0))
                    for stream, n, records in index.db.execute(
                        "SELECT stream, COUNT(*), SUM(records) FROM batches GROUP BY stream"
                    )
                },
                "lost": _lost_count(index),
                "people": index.people(),  # after the segments: every id in their rows is named
            }
            index.db.rollback()
        except sqlite3.DatabaseError as error:
            raise FileNotFoundError(f"{path} is not a readable buffer index: {error}") from None
        finally:
            index.close()
        if had_wal or not _wal(path).exists():
            return snap
        # a learner opened the buffer while the file was read as immutable: read it again, live
    return snap


def _lost_count(index: BufferIndex) -> int:
    """Batches edges reported lost (spool file unreadable); buffers from before the table have none."""
    try:
        return int(index.db.execute("SELECT COUNT(*) FROM lost").fetchone()[0])
    except sqlite3.OperationalError:  # no such table
        return 0


def _segment_status_now(path: Path, segment_id: int) -> str | None:
    """The segment's status in the index right now (after the snapshot), e.g. evicted meanwhile."""
    index = _open_index(path)
    try:
        row = index.db.execute("SELECT status FROM segments WHERE id = ?", (segment_id,)).fetchone()
    finally:
        index.close()
    return row[0] if row else None


# -- files ------------------------------------------------------------------------------------------


def _list_files(directory: Path) -> dict[str, os.stat_result]:
    files = {}
    for entry in os.scandir(directory):
        try:
            if entry.is_file(follow_symlinks=False):
                files[entry.name] = entry.stat(follow_symlinks=False)
        except FileNotFoundError:  # removed while listing (an eviction)
            continue
    return files


def _check(path: Path, verify: bool) -> CorruptSegment | None:
    try:
        segment = read_segment(path, verify=verify)
    except CorruptSegment as problem:
        return problem
    except OSError as error:
        return CorruptSegment(path, "unreadable", f"{type(error).__name__}: {error}")
    del segment  # unmap now
    return None


def _check_segments(directory: Path, snap: dict, listing: dict, verify: bool) -> tuple[list[dict], list[dict]]:
    """One check per indexed (not evicted) segment and per sealed file the index does not list."""
    checks = []
    for record in snap["segments"].values():
        if record.status == "evicted":
            continue
        problem = _check(directory / record.file, verify)
        if problem is not None and problem.reason == "missing" and record.status == "ok":
            status = _segment_status_now(directory / INDEX, record.id)
            if status == "evicted":  # evicted by a running learner after the snapshot
                record.status = "evicted"
                continue
        if problem is None and record.status != "ok":
            problem = CorruptSegment(directory / record.file, record.status, f"marked {record.status} in the index")
        checks.append(_result(record.id, directory / record.file, problem, indexed=True))
    indexed_files = {s.file for s in snap["segments"].values()}
    for name in sorted(listing):
        match = _SEALED.fullmatch(name)
        if match and name not in indexed_files:
            problem = _check(directory / name, verify)
            if problem is None or problem.reason != "missing":  # gone since the listing: evicted
                checks.append(_result(int(match.group(1)), directory / name, problem, indexed=False))
    checks.sort(key=lambda c: c["segment"])
    return checks, [c for c in checks if c["status"] != "ok"]


def _result(segment_id: int, path: Path, problem: CorruptSegment | None, indexed: bool) -> dict[str, Any]:
    return {
        "segment": segment_id,
        "file": path.name,
        "path": str(path),
        "indexed": indexed,
        "status": "ok" if problem is None else "corrupt",
        "reason": None if problem is None else problem.reason,
        "detail": None if problem is None else problem.detail,
    }


def _scan_segments(
    directory: Path, snap: dict, checks: list[dict]
) -> tuple[Counter[tuple[int, int]], set[int], dict[str, dict[str, Any]]]:
    """One read of every indexed segment that checked intact: its step records per (stream,
    episode), and per robot who acted on them and who labelled them (`_who`). Returns those and the
    segments read (one evicted since its check is left out)."""
    intact = {c["segment"] for c in checks if c["indexed"] and c["status"] == "ok"}
    indexed = snap["segments"]
    robot_of = {s.id: s.robot for s in snap["streams"]}
    rows: Counter[tuple[int, int]] = Counter()
    who: dict[str, dict[str, Any]] = {}
    for segment_id in sorted(intact):
        try:
            segment = read_segment(directory / indexed[segment_id].file, verify=False)
        except (CorruptSegment, OSError):  # evicted since the check
            intact.discard(segment_id)
            continue
        n = segment.rows
        columns = segment.columns
        records = np.asarray(columns["kind"][:n]) == KIND_RECORD
        stream = np.asarray(columns["stream"][:n])[records].astype(np.int64)
        keys = np.stack([stream, np.asarray(columns["episode"][:n])[records].astype(np.int64)], axis=1)
        found, counts = np.unique(keys, axis=0, return_counts=True) if len(keys) else ((), ())
        for (stream_id, episode), count in zip(np.asarray(found).tolist(), np.asarray(counts).tolist()):
            rows[(stream_id, episode)] += count
        picked = {  # label_by, idle and the person columns are newer than the others
            name: np.asarray(columns[name][:n])[records] if name in columns else np.zeros(len(stream), np.uint16)
            for name in ("actor", "policy_version", "label", "label_by", IDLE, ACTOR_PERSON, LABEL_PERSON)
        }
        for stream_id in np.unique(stream).tolist():
            mine = stream == stream_id
            robot = who.setdefault(robot_of.get(stream_id, f"stream {stream_id}"), new_counts())
            count_rows(robot, picked, mine, snap["people"])
        del segment, columns
    for counts in who.values():
        counts["people"] = by_name(counts["people"])
    return rows, intact, who


def _episode_length_mismatches(snap: dict, rows: Counter[tuple[int, int]], intact: set[int]) -> list[dict[str, Any]]:
    """Episodes whose length in the index differs from the step records their segments hold
    (`rows`, from `_scan_segments`).

    Only episodes whose every indexed segment reads back intact and whose last one is sealed are
    compared (an episode still being written has rows in the open segment; an evicted or corrupt
    segment's rows are gone)."""
    indexed = snap["segments"]
    streams = {s.id: s for s in snap["streams"]}
    mismatches = []
    for ep in snap["episodes"]:
        span = [i for i in indexed if ep.first_segment <= i <= ep.last_segment]
        if ep.first_segment < 0 or ep.last_segment not in indexed or any(i not in intact for i in span):
            continue
        if rows[(ep.stream, ep.episode)] != ep.length:
            stream = streams.get(ep.stream)
            mismatches.append(
                {
                    "robot": ep.robot,
                    "epoch": stream.epoch if stream else None,
                    "stream": ep.stream,
                    "episode": ep.episode,
                    "status": ep.status,
                    "end_reason": ep.end_reason,
                    "index_length": ep.length,
                    "segment_rows": rows[(ep.stream, ep.episode)],
                }
            )
    return mismatches


def _open_segments(directory: Path, listing: dict) -> list[dict[str, Any]]:
    """Open segments and commit logs: a running learner's, or a crash's leftovers."""
    ids: dict[int, list[str]] = {}
    for name in sorted(listing):
        match = _OPEN.fullmatch(name)
        if match:
            ids.setdefault(int(match.group(1)), []).append(name)
    found = []
    for segment_id, files in sorted(ids.items()):
        batches = []
        log = directory / f"open-{segment_id:08d}.log"
        for payload in CommitLog.read(log)[0]:  # read only: a torn tail is left as it is
            try:
                batches.append(json.loads(payload))
            except ValueError:
                break
        found.append(
            {
                "segment": segment_id,
                "files": files,
                "committed_batches": len(batches),
                "committed_records": sum(int(b.get("n", 0)) for b in batches),
                "committed_rows": max((int(b.get("end", 0)) for b in batches), default=0),
            }
        )
    return found


def _sizes(directory: Path, listing: dict) -> dict[str, int]:
    def allocated(st: os.stat_result) -> int:
        return st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size

    sealed = {n: st for n, st in listing.items() if _SEALED.fullmatch(n)}
    index = {n: st for n, st in listing.items() if n.startswith(INDEX)}
    return {
        "segments": sum(st.st_size for st in sealed.values()),
        "segments_allocated": sum(allocated(st) for st in sealed.values()),
        "index": sum(st.st_size for st in index.values()),
        "total_allocated": sum(allocated(st) for st in listing.values()),
    }


# -- summaries --------------------------------------------------------------------------------------


def _mean(values: list) -> float | None:
    return float(sum(values) / len(values)) if values else None


def _episode_stats(episodes: list[EpisodeRecord]) -> dict[str, Any]:
    labelled = [e.success for e in episodes if e.success is not None]
    versions = [(e.min_version, e.max_version) for e in episodes if e.length > 0]
    return {
        "episodes": len(episodes),
        "labelled": len(labelled),
        "success_rate": _mean(labelled),
        "interventions": sum(e.interventions for e in episodes),
        "policy_versions": [min(v[0] for v in versions), max(v[1] for v in versions)] if versions else None,
    }


def _robots(snap: dict) -> dict[str, dict[str, Any]]:
    streams: dict[str, list[StreamRecord]] = {}
    for s in snap["streams"]:
        streams.setdefault(s.robot, []).append(s)
    robots = {}
    for robot in sorted(streams):
        mine = streams[robot]
        ids = {s.id for s in mine}
        batches = [snap["batches"].get(i, (0, 0)) for i in ids]
        robots[robot] = {
            "streams": len(mine),
            "epochs": sorted({s.epoch for s in mine}),
            "tasks": sorted({s.task for s in mine}),
            "batches": sum(b[0] for b in batches),
            "records": sum(b[1] for b in batches),
            **_episode_stats([e for e in snap["episodes"] if e.stream in ids]),
        }
    return robots


def _tasks(snap: dict) -> dict[str, dict[str, Any]]:
    tasks: dict[str, set[str]] = {}
    for s in snap["streams"]:
        tasks.setdefault(s.task, set()).add(s.robot)
    return {
        task: {"robots": sorted(robots), **_episode_stats([e for e in snap["episodes"] if e.task == task])}
        for task, robots in sorted(tasks.items())
    }


def _spaces(hex_text: str | None) -> dict[str, str] | None:
    if not hex_text:
        return None
    try:
        from user_rl.wire import user_rl_pb2 as pb
        from user_rl.wire.spaces import box_from_proto, dict_space_from_proto

        hello = pb.Hello.FromString(bytes.fromhex(hex_text))
        return {
            "observation": str(dict_space_from_proto(hello.observation_space)),
            "action": str(box_from_proto(hello.action_space)),
        }
    except Exception as error:  # a summary tool: an undecodable field is shown, not fatal
        return {"error": f"{type(error).__name__}: {error}"}


# -- text -------------------------------------------------------------------------------------------


def format_bytes(n: float) -> str:
    """A byte count as people read it (`user-rl buffer inspect`, `user-rl status`)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _versions(span: list[int] | None) -> str:
    return "-" if span is None else (str(span[0]) if span[0] == span[1] else f"{span[0]}-{span[1]}")


def format_report(report: dict[str, Any]) -> str:
    """A readable summary: a header line, the counts, a per-robot table, then problems and notes."""
    seg, eps, size = report["segments"], report["episodes"], report["bytes"]
    lines = [
        f"buffer {report['directory']}: {'OK' if report['ok'] else 'CORRUPT'} - "
        f"{_count(len(report['robots']), 'robot')}, {_count(eps['total'], 'episode')}, "
        f"{_count(report['transitions'], 'transition')} in {_count(seg['ok'], 'segment')}, "
        f"{format_bytes(size['total_allocated'])} on disk",
        f"segments: {seg['ok']} ok, {seg['corrupt']} corrupt, {seg['evicted']} evicted, "
        f"{len(seg['unindexed'])} not indexed, {len(seg['open'])} open; "
        + ("checksums verified" if report["verified"] else "headers only (--no-verify)"),
        f"data: {report['rows']:,} rows, {report['records']:,} step records, {report['transitions']:,} transitions, "
        f"{report['batches']:,} batches"
        + (f" ({report['lost_batches']:,} lost by edges before sending)" if report["lost_batches"] else "")
        + f"; {format_bytes(size['segments'])} of segment files "
        f"({format_bytes(size['segments_allocated'])} allocated), index {format_bytes(size['index'])}",
        "episodes: "
        + ", ".join(f"{eps[s]:,} {s}" for s in EPISODE_STATUSES)
        + (f" ({eps['cut_short']:,} cut short by an edge restart)" if eps["cut_short"] else "")
        + f"; success {_rate(report['success_rate'])} over {eps['labelled']:,} labelled; "
        f"{report['interventions']:,} intervention steps",
    ]
    if report["records_evicted"] or report["records_corrupt"]:
        lines.append(
            f"not sampled: {report['records_evicted']:,} records evicted, "
            f"{report['records_corrupt']:,} in corrupt segments"
        )
    if report["robots"]:
        header = (
            "robot",
            "streams",
            "epochs",
            "tasks",
            "batches",
            "records",
            "episodes",
            "success",
            "interventions",
            "policy",
        )
        rows = [
            (
                name,
                str(r["streams"]),
                _versions([min(r["epochs"]), max(r["epochs"])]),
                ",".join(r["tasks"]),
                f"{r['batches']:,}",
                f"{r['records']:,}",
                f"{r['episodes']:,}",
                _rate(r["success_rate"]),
                f"{r['interventions']:,}",
                _versions(r["policy_versions"]),
            )
            for name, r in report["robots"].items()
        ]
        lines += ["", *table(header, rows, left=4)]
    lines += ["", *format_who(report)]
    if report["tasks"]:
        lines.append("")
        lines.append(
            "tasks: "
            + "; ".join(
                f"{task or '(none)'}: {_count(len(t['robots']), 'robot')}, {_count(t['episodes'], 'episode')}, "
                f"success {_rate(t['success_rate'])}"
                for task, t in report["tasks"].items()
            )
        )
    if report["problems"]:
        lines += ["", f"problems ({len(report['problems'])}):", *(f"  {p}" for p in report["problems"])]
    if report["notes"]:
        lines += ["", "notes:", *(f"  {n}" for n in report["notes"])]
    return "\n".join(lines)
