"""Learning algorithms by name."""

from user_rl.algos.sac import SAC, SACSettings, metrics_to_floats

ALGOS = {"sac": SAC}

__all__ = ["ALGOS", "SAC", "SACSettings", "metrics_to_floats"]
