"""Position-controlled joints behind a simulated motor bus of Feetech STS3215 servos (4096 steps a
turn), calibrated the way LeRobot's SO arms are: a calibration file with each motor's range,
written by `calibrate()`, and positions in degrees about the middle of that range."""

import json
import time
from types import SimpleNamespace

import numpy as np
from lerobot.motors import Motor, MotorCalibration, MotorNormMode
from lerobot.robots.robot import Robot

from .config_sim_arm import SimArmConfig

RANGE = (1024, 3072)  # raw servo steps: +-90 degrees about the middle


class SimArm(Robot):
    config_class = SimArmConfig
    name = "sim_arm"

    def __init__(self, config: SimArmConfig):
        super().__init__(config)
        self.config = config
        self.motors = [f"j{i + 1}" for i in range(config.joints)]
        self.bus = SimpleNamespace(
            motors={m: Motor(i + 1, "sts3215", MotorNormMode.DEGREES) for i, m in enumerate(self.motors)},
            model_resolution_table={"sts3215": 4096},
            calibration=self.calibration,
        )
        self.position = np.zeros(config.joints)
        self.connected = False
        self.sent: list[dict] = []

    @property
    def observation_features(self) -> dict:
        features = {f"{m}.pos": float for m in self.motors}
        if self.config.camera:
            features["wrist"] = (self.config.camera, self.config.camera, 3)
        return features

    @property
    def action_features(self) -> dict:
        return {f"{m}.pos": float for m in self.motors}

    @property
    def is_connected(self) -> bool:
        return self.connected

    def connect(self, calibrate: bool = True) -> None:
        self.connected = True
        if not self.is_calibrated and calibrate:
            self.calibrate()
        self.configure()

    @property
    def is_calibrated(self) -> bool:
        return sorted(self.calibration) == sorted(self.motors)

    def calibrate(self) -> None:
        self.calibration = {m: MotorCalibration(i + 1, 0, 0, *RANGE) for i, m in enumerate(self.motors)}
        self.bus.calibration = self.calibration
        self._save_calibration()

    def configure(self) -> None:
        pass

    def get_observation(self) -> dict:
        observation = {f"{m}.pos": float(p) for m, p in zip(self.motors, self.position)}
        if self.config.camera:
            level = int(np.clip(128 + self.position[0], 0, 255))
            observation["wrist"] = np.full((self.config.camera, self.config.camera, 3), level, np.uint8)
        return observation

    def send_action(self, action: dict) -> dict:
        if 0 <= self.config.stall_after <= len(self.sent):
            time.sleep(60.0)  # a bus that stopped answering
        goal = np.array([action.get(f"{m}.pos", p) for m, p in zip(self.motors, self.position)])
        goal = np.clip(goal, -90.0, 90.0)  # the servos' position limits (the calibrated range)
        if self.config.log:
            with open(self.config.log, "a") as log:
                log.write(
                    json.dumps({"t": time.time(), "goal": goal.tolist(), "position": self.position.tolist()}) + "\n"
                )
        step = np.clip(goal - self.position, -self.config.max_step_deg, self.config.max_step_deg)
        self.position = self.position + step
        sent = {f"{m}.pos": float(g) for m, g in zip(self.motors, goal)}
        self.sent.append(sent)
        return sent

    def disconnect(self) -> None:
        self.connected = False
