"""An example user-rl plugin: a task (task.py), a policy (policy.py), an algorithm (algo.py) and a
reward (reward.py). docs/guides/ in the user-rl repository walks through each."""
