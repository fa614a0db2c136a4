"""The fleet table that `user-rl status ADDRESS` asks a running learner for, as a wire message.

The learner answers a `StatusRequest` on its data link with what its status already holds: one
row per robot (health and last error come from the robot's heartbeats) and the run's counters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from user_rl.wire import user_rl_pb2 as pb


def status_reply(status: Mapping[str, Any]) -> pb.StatusReply:
    """A `StatusReply` from the learner's status dict (`Learner.status()`)."""
    reply = pb.StatusReply(
        env_steps=int(status.get("env_steps", 0)),
        updates=int(status.get("updates", 0)),
        policy_version=int(status.get("policy_version", -1)),
        buffer_transitions=int(status.get("buffer", 0)),
        uptime_s=float(status.get("time", 0.0)),
    )
    for robot_id, robot in sorted((status.get("robots") or {}).items()):
        acting = robot.get("acting_version")
        reply.robots.add(
            robot_id=robot_id,
            health=robot.get("health") or "unknown",
            policy_version=-1 if acting is None else int(acting),
            policy_lag=-1 if robot.get("policy_lag") is None else int(robot["policy_lag"]),
            steps_per_second=float(robot.get("steps_per_second") or 0.0),
            spool_bytes=int(robot.get("backlog_bytes") or 0),
            backlog_batches=int(robot.get("backlog_batches") or 0),
            last_error=robot.get("last_error") or "",
            transitions=int(robot.get("transitions") or 0),
            heard_s_ago=float(robot.get("seconds_since_seen") or 0.0),
            quarantined_batches=int(robot.get("quarantined_batches") or 0),
            rearmed=robot.get("rearmed") or "",
        )
    return reply


def status_from_reply(reply: pb.StatusReply) -> dict[str, Any]:
    """The reply as the same dict shape the learner's status has (one table renders both)."""
    robots = {
        r.robot_id: {
            "health": r.health,
            "acting_version": None if r.policy_version < 0 else r.policy_version,
            "policy_lag": None if r.policy_lag < 0 else r.policy_lag,
            "steps_per_second": r.steps_per_second,
            "backlog_bytes": r.spool_bytes,
            "backlog_batches": r.backlog_batches,
            "last_error": r.last_error or None,
            "transitions": r.transitions,
            "seconds_since_seen": r.heard_s_ago,
            "quarantined_batches": r.quarantined_batches,
            "rearmed": r.rearmed or None,
        }
        for r in reply.robots
    }
    return {
        "env_steps": reply.env_steps,
        "updates": reply.updates,
        "policy_version": reply.policy_version,
        "buffer": reply.buffer_transitions,
        "time": reply.uptime_s,
        "robots": robots,
    }
