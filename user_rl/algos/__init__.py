"""Learning algorithms by name."""

from user_rl.algos.sac import SAC, SACSettings

ALGOS = {"sac": SAC}

__all__ = ["ALGOS", "SAC", "SACSettings"]
