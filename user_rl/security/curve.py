"""CurveZMQ on the learner's sockets and the edges': encryption, and a gatekeeper that admits
only enrolled robot keys.

The learner's context runs one ZAP handler (pyzmq's ThreadAuthenticator) that asks `Enrolment`
at every handshake, and names each admitted peer by its robot id: every message then carries
that id as its `User-Id`, so the ingest can refuse a message from a key revoked since the
handshake, and a robot speaking under another robot's name.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import zmq
from zmq.utils import z85
from zmq.auth.thread import ThreadAuthenticator

from user_rl.config import SecurityConfig
from user_rl.security.keys import LEARNER, Enrolment, KeyPair, learner_keys, learner_public_key, robot_keys

log = logging.getLogger(__name__)
ZAP_DOMAIN = "user-rl"
LOOPBACK = ("127.", "localhost", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    host = host.removeprefix("tcp://").rpartition(":")[0] or host
    return host.startswith(LOOPBACK)


def curve_enabled(mode: str, host: str) -> bool:
    """`auto` encrypts every deployment that is not all-loopback."""
    return mode == "on" or (mode == "auto" and not is_loopback(host))


def secure_server(socket: zmq.Socket, keys: KeyPair) -> None:
    """Before bind: encrypt, and have the context's gatekeeper check every client's key."""
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_server = True
    socket.zap_domain = ZAP_DOMAIN.encode()


def secure_client(socket: zmq.Socket, keys: KeyPair, server_public: bytes) -> None:
    """Before connect: encrypt to the learner, proving who we are with our own keypair."""
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_serverkey = server_public


@dataclass
class ClientKeys:
    """What an edge (or the launch's evaluator) needs to reach a learner that runs CurveZMQ."""

    keys: KeyPair
    learner_public: bytes

    @classmethod
    def for_robot(cls, keys_dir: str | Path, robot_id: str) -> "ClientKeys":
        return cls(robot_keys(keys_dir, robot_id), learner_public_key(keys_dir))

    @classmethod
    def for_learner_host(cls, keys_dir: str | Path) -> "ClientKeys":
        """The launch itself (evaluator) speaks with the learner's own keypair."""
        keys = learner_keys(keys_dir)
        return cls(keys, keys.public)

    def apply(self, socket: zmq.Socket) -> None:
        secure_client(socket, self.keys, self.learner_public)


@dataclass
class Gatekeeper:
    """The learner's ZAP handler: enrolled robots (and the learner's own key) in, the rest out."""

    context: zmq.Context
    keys_dir: Path
    denied: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.keys = learner_keys(self.keys_dir)
        self.enrolment = Enrolment(self.keys_dir)
        self.revoked = Enrolment(self.keys_dir, subdirectory="revoked")  # to name refused robots
        self._auth = ThreadAuthenticator(self.context, log=log)
        # The ZAP reply's user id (binary key -> robot id) travels with every message as `User-Id`.
        self._auth.curve_user_id = lambda key: self.robot_for(z85.encode(key)) or ""  # type: ignore[method-assign]
        self._auth.start()
        self._auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=self)

    def robot_for(self, public_key_z85: bytes) -> str | None:
        if public_key_z85 == self.keys.public:
            return LEARNER
        return self.enrolment.robot_for(public_key_z85)

    def is_enrolled(self, robot_id: str | None) -> bool:
        """Whether this robot's key is enrolled now (a message may come after a revocation)."""
        return robot_id is not None and robot_id in self.enrolment.robots()

    def callback(self, domain: str, public_key_z85: bytes) -> bool:
        """Asked by the ZAP thread at every handshake."""
        if self.robot_for(public_key_z85) is not None:
            return True
        revoked = self.revoked.robot_for(public_key_z85)
        shown = f"{revoked} (revoked)" if revoked else public_key_z85.decode(errors="replace")
        if not self.denied[shown]:
            log.warning("refused a connection: key %s is not enrolled in %s", shown, self.enrolment.directory)
        self.denied[shown] += 1
        return False

    def close(self) -> None:
        self._auth.stop()


def learner_gate(context: zmq.Context, security: SecurityConfig, host: str) -> Gatekeeper | None:
    """The learner's gatekeeper, or None when its links run in the clear (all-loopback, or curve=off)."""
    if not curve_enabled(security.curve, host):
        return None
    return Gatekeeper(context, Path(security.keys_dir))


def robot_client_keys(security: SecurityConfig, learner_address: str, robot_id: str) -> ClientKeys | None:
    """An edge's keys for the learner at `learner_address`, or None when that link runs in the clear."""
    if not curve_enabled(security.curve, learner_address):
        return None
    return ClientKeys.for_robot(security.keys_dir, robot_id)


def launch_client_keys(security: SecurityConfig, learner_address: str) -> ClientKeys | None:
    """The launch's own keys (its evaluator fetches weights), or None in the clear."""
    if not curve_enabled(security.curve, learner_address):
        return None
    return ClientKeys.for_learner_host(security.keys_dir)



def check_launch_keys(security: SecurityConfig, learner_host: str, robot_ids: list[str]) -> None:
    """Before a launch starts anything: if its links are encrypted, the learner's keypair and every
    robot's must be there (a ConfigError names the missing file and how to make it)."""
    if not curve_enabled(security.curve, learner_host):
        return
    learner_keys(security.keys_dir)
    for robot_id in robot_ids:
        robot_keys(security.keys_dir, robot_id)
