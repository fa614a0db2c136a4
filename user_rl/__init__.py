"""user-rl: online policy learning on real robots and simulated robot fleets."""

__version__ = "0.1.0"
