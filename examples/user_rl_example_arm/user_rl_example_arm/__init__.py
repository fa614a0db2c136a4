"""A user-rl robot driver for the example two-joint arm, packaged apart from user-rl.

`driver.py` is the driver (registered as `example_arm` in pyproject.toml), `client.py` the
controller's wire protocol, `simulated_controller.py` a controller to try it without the arm.
Nothing is imported here, so the simulated controller starts without loading user-rl.
"""
