"""LeRobot's robots and teleoperators behind the HAL: `devices.py` finds and connects them by LeRobot's
own config (the LeRobot teleoperator's intervention source, `user_rl/edge/lerobot_teleop.py`, and
`hal discover` use it too), `robot.py` is the `robot.type: lerobot` driver. Nothing here imports
LeRobot until a device is made, so the package imports on an install without the lerobot extra.
"""
