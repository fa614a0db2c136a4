"""Launching a training: where each process goes (`placement`), keeping the fleet running
(`fleet_health`), and the run from start to summary (`training`). The only code that uses Ray;
`placement` does not import it, so a config can be checked against a cluster view anywhere.

    from user_rl.launch import train
    summary = train(load_config("configs/reach.yaml"))
"""

from typing import Any

__all__ = ["FleetFailed", "train"]


def __getattr__(name: str) -> Any:
    """`train` and `FleetFailed` load Ray only when first asked for."""
    if name in __all__:
        from user_rl.launch import training

        return getattr(training, name)
    raise AttributeError(f"module 'user_rl.launch' has no attribute {name!r}")
