"""Who did what in a buffer, for `user-rl buffer inspect`: who acted on each step record (the
policy, its warm-up, a person, the scripted expert) and who labelled it (a person, the env, a
classifier), and people by name (wire/transitions.PEOPLE), counted per robot and in all, and as text."""

from __future__ import annotations

from typing import Any

import numpy as np

from user_rl.wire import user_rl_pb2 as pb
from user_rl.wire.transitions import ACTOR_PERSON, IDLE, LABEL_PERSON

# Who acted on a row, as inspect names them: warm-up is the random actions before a policy arrived
# (ACTOR_WARMUP, or a policy row with no version, as buffers before ACTOR_WARMUP recorded them).
ACTED_BY = ("policy", "warmup", "person", "scripted")
LABELLED_BY = {pb.LABEL_BY_PERSON: "person", pb.LABEL_BY_ENV: "env", pb.LABEL_BY_CLASSIFIER: "classifier"}
# Person rows and person labels that name nobody: edges and buffers from before names were recorded
# (wire/transitions.PEOPLE), or names past a batch's or the buffer's limits.
UNNAMED = "(no name)"
PEOPLE_SHOWN = 20  # rows of the text's people tables (--json lists everyone)


def new_counts() -> dict[str, Any]:
    return {
        "records": 0,  # step records in intact sealed segments
        "acted": dict.fromkeys(ACTED_BY, 0),
        "person_idle": 0,  # person rows on which they held nothing
        "labelled": {by: {"success": 0, "failure": 0} for by in LABELLED_BY.values()},
        "people": {},  # by name: rows they acted on (and held nothing), labels they gave
        "unnamed": _person(),  # person rows and person labels that name nobody (UNNAMED)
    }


def _person() -> dict[str, Any]:
    return {"acted": 0, "idle": 0, "labelled": {"success": 0, "failure": 0}}


def count_rows(who: dict[str, Any], picked: dict[str, np.ndarray], mine: np.ndarray, names: dict[int, str]) -> None:
    """Add one robot's records of a segment (`mine` of the `picked` columns) to its counts; `names`:
    the buffer's people by id."""
    actor, version = picked["actor"][mine], picked["policy_version"][mine]
    who["records"] += int(mine.sum())
    policy = actor == pb.ACTOR_POLICY
    acted = who["acted"]
    acted["policy"] += int(np.count_nonzero(policy & (version >= 0)))
    acted["warmup"] += int(np.count_nonzero((actor == pb.ACTOR_WARMUP) | (policy & (version < 0))))
    acted["person"] += int(np.count_nonzero(actor == pb.ACTOR_HUMAN))
    acted["scripted"] += int(np.count_nonzero(actor == pb.ACTOR_SCRIPTED))
    who["person_idle"] += int(np.count_nonzero((actor == pb.ACTOR_HUMAN) & picked[IDLE][mine].astype(bool)))
    label, label_by = picked["label"][mine], picked["label_by"][mine]
    for code, by in LABELLED_BY.items():
        for value, name in ((pb.LABEL_SUCCESS, "success"), (pb.LABEL_FAILURE, "failure")):
            who["labelled"][by][name] += int(np.count_nonzero((label == value) & (label_by == code)))
    _count_people(who, picked, mine, names)


def _count_people(who: dict[str, Any], picked: dict[str, np.ndarray], mine: np.ndarray, names: dict[int, str]) -> None:
    """Rows and labels by person name; a person row or label that names nobody (an id 0, or one the
    buffer has no name for) counts as `unnamed`."""
    actor, acted_by, labelled_by = picked["actor"][mine], picked[ACTOR_PERSON][mine], picked[LABEL_PERSON][mine]
    label, label_by, idle = picked["label"][mine], picked["label_by"][mine], picked[IDLE][mine].astype(bool)
    known = np.array(sorted(names), np.int64)
    acted_named, labelled_named = np.isin(acted_by, known), np.isin(labelled_by, known)
    counts = [(acted_named, "acted", acted_by), (acted_named & idle, "idle", acted_by)]
    unnamed = who["unnamed"]
    person = actor == pb.ACTOR_HUMAN
    unnamed["acted"] += int(np.count_nonzero(person & ~acted_named))
    unnamed["idle"] += int(np.count_nonzero(person & ~acted_named & idle))
    for value, name in ((pb.LABEL_SUCCESS, "success"), (pb.LABEL_FAILURE, "failure")):
        given = label == value
        counts.append((given & labelled_named, name, labelled_by))
        unnamed["labelled"][name] += int(np.count_nonzero(given & (label_by == pb.LABEL_BY_PERSON) & ~labelled_named))
    for rows, what, ids in counts:
        found, n = np.unique(ids[rows], return_counts=True)
        for i, count in zip(found.tolist(), n.tolist()):
            counted = who["people"].setdefault(names[i], _person())
            if what in ("acted", "idle"):
                counted[what] += count
            else:
                counted["labelled"][what] += count


def by_name(people: dict[str, Any]) -> dict[str, Any]:
    """People in the order a reader looks for them: by name, case aside."""
    return dict(sorted(people.items(), key=lambda item: (item[0].casefold(), item[0])))


def _add_person(into: dict[str, Any], counts: dict[str, Any]) -> None:
    into["acted"] += counts["acted"]
    into["idle"] += counts["idle"]
    for name, n in counts["labelled"].items():
        into["labelled"][name] += n


def total(per_robot: dict[str, dict[str, Any]]) -> dict[str, Any]:
    total = new_counts()
    for who in per_robot.values():
        total["records"] += who["records"]
        total["person_idle"] += who["person_idle"]
        for name, n in who["acted"].items():
            total["acted"][name] += n
        for by, counts in who["labelled"].items():
            for name, n in counts.items():
                total["labelled"][by][name] += n
        for name, counts in who["people"].items():
            _add_person(total["people"].setdefault(name, _person()), counts)
        _add_person(total["unnamed"], who["unnamed"])
    total["people"] = by_name(total["people"])
    return total


def _labels(labelled: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{by} {c['success']:,} success / {c['failure']:,} failure" for by, c in labelled.items())


def format_who(report: dict[str, Any]) -> list[str]:
    """Who acted on the step records and who labelled them, over the buffer and per robot."""
    who = report["who"]
    acted = who["acted"]
    lines = [
        f"acted: {who['records']:,} step records: policy {acted['policy']:,}, warm-up {acted['warmup']:,}, "
        f"person {acted['person']:,} ({who['person_idle']:,} holding nothing), scripted {acted['scripted']:,}",
        f"labelled: {_labels(who['labelled'])}",
    ]
    if len(report["robots"]) > 1:
        header = ("robot", "records", "policy", "warm-up", "person", "idle", "scripted", "labels by person")
        rows = []
        for name, r in report["robots"].items():
            w, a = r["who"], r["who"]["acted"]
            counts = (w["records"], a["policy"], a["warmup"], a["person"], w["person_idle"], a["scripted"])
            person = w["labelled"]["person"]
            rows.append(
                (name, *(f"{n:,}" for n in counts), f"{person['success']:,} success / {person['failure']:,} failure")
            )
        lines += ["", *table(header, rows, left=1)]
    return lines + _format_people(report)


def _format_people(report: dict[str, Any]) -> list[str]:
    """Rows and labels by person name, over the buffer and (with several robots) per robot; the most
    active `PEOPLE_SHOWN` of each, the rest counted."""
    who = report["who"]
    unnamed = who["unnamed"]
    has_unnamed = unnamed["acted"] or any(unnamed["labelled"].values())
    if not who["people"] and not has_unnamed:
        return ["", "people by name: nobody acted or labelled"]
    named = len(who["people"])
    lines = ["", f"people by name: {named:,} {'person' if named == 1 else 'people'} named"]
    if has_unnamed:
        lines[-1] += (
            f"; {unnamed['acted']:,} person rows and {sum(unnamed['labelled'].values()):,} person labels name "
            f"nobody (shown as {UNNAMED}: from before names were recorded, or past the name limits)"
        )
    header = ("person", "acted", "idle", "labels")
    lines += ["", *_people_table(header, [((), who)])]
    if len(report["robots"]) > 1:
        robots = [((robot,), r["who"]) for robot, r in report["robots"].items()]
        lines += ["", *_people_table(("robot", *header), robots)]
    return lines


def _people_table(header: tuple[str, ...], groups: list[tuple[tuple[str, ...], dict[str, Any]]]) -> list[str]:
    """A table of each group's people (after the group's leading cells, e.g. its robot), in group
    order, the busiest first within a group (and the rows that name nobody last); `PEOPLE_SHOWN` rows,
    then how many more there are."""
    rows = []
    for group, (lead, who) in enumerate(groups):
        people = [(False, name, c) for name, c in who["people"].items()]
        if who["unnamed"]["acted"] or any(who["unnamed"]["labelled"].values()):
            people.append((True, UNNAMED, who["unnamed"]))
        for unnamed, name, c in people:
            labels = c["labelled"]
            cells = (
                f"{c['acted']:,}",
                f"{c['idle']:,}",
                f"{labels['success']:,} success / {labels['failure']:,} failure",
            )
            rows.append(((group, unnamed, -(c["acted"] + sum(labels.values()))), (*lead, name, *cells)))
    rows.sort(key=lambda row: row[0])  # stable: by name among equals; nobody named last
    lines = table(header, [cells for _, cells in rows[:PEOPLE_SHOWN]], left=len(header) - 3)
    if len(rows) > PEOPLE_SHOWN:
        lines.append(f"... and {len(rows) - PEOPLE_SHOWN:,} more (--json lists them all)")
    return lines


def table(header: tuple[str, ...], rows: list[tuple[str, ...]], left: int) -> list[str]:
    """Aligned columns: the first `left` to the left, the rest to the right."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(w) if i < left else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
        for row in [header, *rows]
    ]
