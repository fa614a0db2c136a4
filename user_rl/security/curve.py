"""CurveZMQ on the learner's sockets and the edges': encryption, and a gatekeeper that admits
only enrolled robot keys.

The learner's context runs one ZAP handler (pyzmq's ThreadAuthenticator) that asks `Enrolment`
at every handshake, and names each admitted peer by its robot id and public key: every message
then carries `<robot id>/<key>` as its `User-Id`, so the ingest can refuse a message from a key
revoked since the handshake (also when the robot was enrolled again with a new key since), and
a robot speaking under another robot's name.

Refused handshakes are counted, with the most recent refused keys named (a bounded map: a
stranger trying millions of keys costs a counter, not memory).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from user_rl.config import SecurityConfig
from user_rl.security.keys import LEARNER, Enrolment, KeyPair, learner_keys, learner_public_key, robot_keys

log = logging.getLogger(__name__)
ZAP_DOMAIN = "user-rl"
LOOPBACK = ("127.", "localhost", "::1", "[::1]")
MAX_DENIED_SHOWN = 64  # refused keys named in the status (the most recent); all are counted
MAX_DENIED_LOGGED = 20  # distinct refused keys logged as warnings; beyond, only counted


def peer_user_id(robot_id: str, public_key_z85: bytes) -> str:
    """The `User-Id` a message of an admitted peer carries: its robot id and the key it proved."""
    return f"{robot_id}/{public_key_z85.decode()}"


def split_user_id(user_id: str | None) -> tuple[str | None, bytes | None]:
    """(robot id, z85 public key) from a `User-Id`; robot ids never hold '/', keys may."""
    if not user_id or "/" not in user_id:
        return None, None
    robot_id, _, key = user_id.partition("/")
    return robot_id, key.encode()


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
    def for_robot(cls, keys_dir: str | Path, robot_id: str) -> ClientKeys:
        return cls(robot_keys(keys_dir, robot_id), learner_public_key(keys_dir))

    @classmethod
    def for_learner_host(cls, keys_dir: str | Path) -> ClientKeys:
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
    max_denied_shown: int = MAX_DENIED_SHOWN
    # Refused handshakes by key (or "<robot> (revoked)"), the most recent last; bounded.
    denied: OrderedDict[str, int] = field(default_factory=OrderedDict)
    denied_total: int = 0  # every refused handshake, also of keys no longer named in `denied`
    denied_keys: int = 0  # distinct refused keys seen (a key dropped from `denied` and back counts again)

    def __post_init__(self) -> None:
        self.keys = learner_keys(self.keys_dir)
        self.enrolment = Enrolment(self.keys_dir)
        self.revoked = Enrolment(self.keys_dir, subdirectory="revoked")  # revoked for good, by key
        self._lock = threading.Lock()  # the ZAP thread counts refusals; the ingest thread reports them
        self._auth = ThreadAuthenticator(self.context, log=log)
        # The ZAP reply's user id travels with every message as `User-Id`: "<robot id>/<key>".
        self._auth.curve_user_id = self._user_id  # type: ignore[method-assign]
        self._auth.start()
        self._auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=self)

    def _user_id(self, public_key: bytes) -> str:
        key = z85.encode(public_key)
        robot_id = self.robot_for(key)
        return peer_user_id(robot_id, key) if robot_id else ""

    def robot_for(self, public_key_z85: bytes, recheck: bool = False) -> str | None:
        """The robot this key speaks for now: None for unknown and revoked keys. `recheck`: read
        the key directories now if they changed (bounded: see `Enrolment`)."""
        if public_key_z85 == self.keys.public:
            return LEARNER
        if self.revoked.robot_for(public_key_z85, recheck) is not None:  # even if copied back into enrolled/
            return None
        return self.enrolment.robot_for(public_key_z85, recheck)

    def is_enrolled(self, user_id: str | None) -> bool:
        """Whether the key behind a message's `User-Id` is enrolled now, for the robot it names
        (a message may come after a revocation, or after its robot was enrolled with a new key)."""
        robot_id, key = split_user_id(user_id)
        return robot_id is not None and key is not None and self.robot_for(key) == robot_id

    def callback(self, domain: str, public_key_z85: bytes) -> bool:
        """Asked by the ZAP thread at every handshake. A key not known yet is looked up again in the
        directories as they are now: a robot enrolled (or re-enrolled) a moment ago is let in, since
        a refused handshake is final for its edge."""
        if self.robot_for(public_key_z85) is not None or self.robot_for(public_key_z85, recheck=True) is not None:
            return True
        revoked = self.revoked.robot_for(public_key_z85)
        shown = f"{revoked} (revoked)" if revoked else public_key_z85.decode(errors="replace")
        with self._lock:
            self.denied_total += 1
            count = self.denied.pop(shown, 0)
            self.denied[shown] = count + 1
            if not count:
                self.denied_keys += 1
                while len(self.denied) > self.max_denied_shown:  # forget the longest-quiet key
                    self.denied.popitem(last=False)
            new_key_number = self.denied_keys if not count else 0
        if 0 < new_key_number <= MAX_DENIED_LOGGED:
            log.warning("refused a connection: key %s is not enrolled in %s", shown, self.enrolment.directory)
            if new_key_number == MAX_DENIED_LOGGED:
                log.warning(
                    "refused %d distinct keys: further refusals are only counted (status: keys_refused)", new_key_number
                )
        return False

    def denied_report(self) -> tuple[dict[str, int], int]:
        """(the most recent refused keys and their counts, all refusals): bounded, for the status."""
        with self._lock:
            return dict(self.denied), self.denied_total

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
