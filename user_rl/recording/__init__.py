"""`user-rl record` and `user-rl replay`: the first two commands a LeRobot user runs on a new arm.

    user-rl record configs/arm.yaml --out demos/buffer --episodes 10 --episode-time-s 30 \\
        --reset-time-s 10 --task "put the cube in the bowl" [--dataset demos/lerobot]
    user-rl replay demos/buffer --episode 3 configs/arm.yaml      # or a LeRobotDataset's directory

`record` (`record.py`): a person drives the config's robot through the intervention sources the
edge has (a LeRobot teleoperator, the teleop page), with no policy and no learner; every step is
theirs. Episodes of up to T s alternate with R s of reset time, driven but not recorded (LeRobot's
reset phase); the teleoperator's events and keys on the terminal end an episode early, re-record it
or stop (`keys.py`). Steps go straight into a buffer directory (`writer.py`, the learner's own
`PersistentReplay`), so `buffer export` and `buffer.attach` take it; `--dataset` also exports it
as a LeRobotDataset at the end.

`replay` (`replay.py`): one recorded episode's actions, played back on a robot at the recorded
rate through the safety filter every action passes on its way to a robot.

Both call the robot from one thread of its own with a deadline (`driving.py`): a robot that stops
answering ends the command with a clear error instead of hanging it. `commands.py` holds their
command-line arguments (`user_rl/cli.py` adds them).
"""
