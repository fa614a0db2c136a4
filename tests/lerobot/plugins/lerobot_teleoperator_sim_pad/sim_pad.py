"""A gamepad with LeRobot's teleop events, pressed by a script instead of a person."""

from lerobot.teleoperators.teleoperator import Teleoperator
from lerobot.teleoperators.utils import TeleopEvents

from .config_sim_pad import SimPadConfig


class SimPad(Teleoperator):
    config_class = SimPadConfig
    name = "sim_pad"

    def __init__(self, config: SimPadConfig):
        super().__init__(config)
        self.config = config
        self.connected = False
        self.reads = 0
        self.actions = 0

    @property
    def action_features(self) -> dict:
        return {f"j{i + 1}.pos": float for i in range(self.config.joints)}

    @property
    def feedback_features(self) -> dict:
        return {}

    @property
    def is_connected(self) -> bool:
        return self.connected

    def connect(self, calibrate: bool = True) -> None:
        self.connected = True

    @property
    def is_calibrated(self) -> bool:
        return True

    def calibrate(self) -> None:
        pass

    def configure(self) -> None:
        pass

    def get_teleop_events(self) -> dict:
        read, self.reads = self.reads, self.reads + 1
        c = self.config
        return {
            TeleopEvents.IS_INTERVENTION: any(start <= read < stop for start, stop in c.intervene),
            TeleopEvents.SUCCESS: read in c.success,
            TeleopEvents.FAILURE: False,
            TeleopEvents.RERECORD_EPISODE: read in c.rerecord,
            TeleopEvents.TERMINATE_EPISODE: read in c.rerecord,
        }

    def get_action(self) -> dict:
        path, self.actions = self.config.path, self.actions + 1
        pose = path[(self.actions - 1) % len(path)] if path else self.config.pose
        return {f"j{i + 1}.pos": float(v) for i, v in enumerate(pose)}

    def send_feedback(self, feedback: dict) -> None:
        pass

    def disconnect(self) -> None:
        self.connected = False
