"""Helpers for testing your own robot driver and links against user-rl, shipped with the package:

- `fault_proxy.FaultProxy`: a TCP proxy between an edge and its learner that adds delay, a shared
  bandwidth cap and dropped connections (a bad network without root, `tc` or netem);
- `learner.serving_learner`: a learner serving from a thread of the test's own process, to drive
  an edge (your driver's) at;
- `wait`: waiting for a condition, a free port, a run's directory, a polling loop on a thread.

The suite's own infrastructure (the LeRobot venv builder, the example driver installed with pip,
weight-sync test doubles) lives in the repository's `tests/support/`, not in the installed package.
"""
