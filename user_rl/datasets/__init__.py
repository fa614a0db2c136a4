"""Datasets a buffer exports to and imports from (`user-rl buffer export / import`): `lerobot.py`,
LeRobotDataset v3. They read the buffer (`cloud/buffer`) and lay rows out as an edge would
(`edge/batching.py`), so this package sits above both and only the command line imports it.
"""
