"""CurveZMQ keys on disk: the learner's keypair, one per robot, and the learner's enrolment list.

    keys/
      learner.key, learner.key_secret      the learner's keypair (robots get learner.key)
      robots/<id>.key, robots/<id>.key_secret   one keypair per robot (install on its controller)
      enrolled/<id>.key                    public keys the learner accepts
      revoked/<id>.key, revoked/<id>.key.2 ...   keys taken back, every one kept

`user-rl keys generate DIR ROBOT_ID ...` makes what is missing and never overwrites a key;
`user-rl keys revoke DIR ID` moves a key from enrolled/ to revoked/, and `user-rl keys enroll`
(also over a robot's current key) replaces `enrolled/<id>.key` atomically; a running learner
notices either within a fraction of a second, and at once at the handshake of a key it does not
know yet (no restart). Revocation is of the key, not the name: a revoked key stays out for good,
also when its robot is enrolled again with a new keypair, and `enroll` refuses to take a revoked
key back.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import zmq.auth

from user_rl.config import ConfigError
from user_rl.token_bucket import TokenBucket

LEARNER = "learner"
# Looks at enrolled/ asked for by handshakes of unknown keys: up to a burst of this many, then this many a
# second (a stranger trying keys costs a bounded number of directory listings, not one per try).
FORCED_RECHECKS_BURST = 20
FORCED_RECHECKS_PER_S = 20.0
_KEY_FILE = re.compile(r"^(?P<robot>.+)\.key(\.\d+)?$")  # <id>.key, or <id>.key.<n> for a robot's n-th revoked key


@dataclass(frozen=True)
class KeyPair:
    public: bytes  # z85, 40 bytes
    secret: bytes


def _secret_path(directory: Path, name: str) -> Path:
    return directory / f"{name}.key_secret"


def _check_robot_id(robot_id: str) -> None:
    if not robot_id or "/" in robot_id or robot_id.startswith(".") or robot_id == LEARNER:
        raise ConfigError(f"keys: {robot_id!r} cannot name a robot key (no '/', no leading '.', not 'learner')")


def generate(keys_dir: str | Path, robots: list[str]) -> list[Path]:
    """Make the learner's keypair and each robot's, enrolling new robots; return the files written."""
    keys_dir = Path(keys_dir)
    for robot_id in robots:
        _check_robot_id(robot_id)
    written: list[Path] = []
    keys_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(keys_dir, 0o700)
    if not _secret_path(keys_dir, LEARNER).exists():
        written += [Path(p) for p in zmq.auth.create_certificates(keys_dir, LEARNER)]
    for sub in ("robots", "enrolled", "revoked"):
        (keys_dir / sub).mkdir(exist_ok=True)
    for robot_id in robots:
        if _secret_path(keys_dir / "robots", robot_id).exists():
            continue
        public, secret = zmq.auth.create_certificates(keys_dir / "robots", robot_id)
        written += [Path(public), Path(secret)]
        shutil.copy(public, keys_dir / "enrolled" / f"{robot_id}.key")
        written.append(keys_dir / "enrolled" / f"{robot_id}.key")
    for path in written:
        if path.name.endswith("_secret"):
            os.chmod(path, 0o600)
    return written


def revoke(keys_dir: str | Path, robot_id: str) -> Path:
    """Take a robot's key back: a running learner refuses it from its next message on."""
    keys_dir = Path(keys_dir)
    enrolled = keys_dir / "enrolled" / f"{robot_id}.key"
    if not enrolled.is_file():
        known = sorted(p.stem for p in (keys_dir / "enrolled").glob("*.key"))
        raise ConfigError(f"keys: {robot_id!r} is not enrolled in {keys_dir}; enrolled: {', '.join(known) or 'none'}")
    target = keys_dir / "revoked" / enrolled.name
    target.parent.mkdir(exist_ok=True)
    n = 1
    while target.exists():  # the robot had a key revoked before: keep every revoked key
        n += 1
        target = keys_dir / "revoked" / f"{enrolled.name}.{n}"
    os.replace(enrolled, target)
    return target


def enroll(keys_dir: str | Path, robot_id: str, public_key_file: str | Path) -> Path:
    """Accept a robot whose keypair was made elsewhere (its public `.key` file).

    A key that was revoked is refused for good (ConfigError): give the robot a new keypair."""
    _check_robot_id(robot_id)
    keys_dir = Path(keys_dir)
    public, _ = _load(Path(public_key_file), need_secret=False)
    for path, _robot in key_files(keys_dir / "revoked"):
        if _public_key(path) == public:
            raise ConfigError(
                f"keys: {public_key_file} holds a revoked key ({path}); a revoked key stays out "
                "for good: make the robot a new keypair"
            )
    target = keys_dir / "enrolled" / f"{robot_id}.key"
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written aside, then renamed over the old key: a learner never reads half a key, and the rename
    # is a new file (inode, directory entry) that it notices even within one mtime tick.
    staged = target.with_name(f".{target.name}.tmp")
    shutil.copy(public_key_file, staged)
    os.replace(staged, target)
    return target


def key_files(directory: Path) -> Iterator[tuple[Path, str]]:
    """(file, robot id) for each public key file in `directory` (enrolled/ or revoked/)."""
    if not directory.is_dir():
        return
    for path in sorted(directory.iterdir()):
        match = _KEY_FILE.match(path.name)
        if match and path.is_file():
            yield path, match["robot"]


def _public_key(path: Path) -> bytes | None:
    """The public key in a `.key` file, or None for a half-copied or foreign file."""
    try:
        return zmq.auth.load_certificate(path)[0]
    except (ValueError, OSError):
        return None


def _load(path: Path, need_secret: bool) -> tuple[bytes, bytes | None]:
    if not path.is_file():
        raise ConfigError(f"keys: no key file at {path}; make keys with `user-rl keys generate KEYS_DIR ROBOT_ID ...`")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"keys: {path} is not a CurveZMQ key file ({exc})") from None
    if need_secret and not secret:
        raise ConfigError(f"keys: {path} holds no secret key")
    return public, secret


def learner_keys(keys_dir: str | Path) -> KeyPair:
    public, secret = _load(_secret_path(Path(keys_dir), LEARNER), need_secret=True)
    return KeyPair(public, secret)


def learner_public_key(keys_dir: str | Path) -> bytes:
    """What a robot needs to know about the learner: its public key (`learner.key`)."""
    return _load(Path(keys_dir) / f"{LEARNER}.key", need_secret=False)[0]


def robot_keys(keys_dir: str | Path, robot_id: str) -> KeyPair:
    public, secret = _load(_secret_path(Path(keys_dir) / "robots", robot_id), need_secret=True)
    return KeyPair(public, secret)


class Enrolment:
    """The robots the learner accepts, by public key; re-read when `enrolled/` changes.
    (With subdirectory="revoked": the keys taken back, by key, each naming its robot.)"""

    def __init__(self, keys_dir: str | Path, recheck_s: float = 0.2, subdirectory: str = "enrolled") -> None:
        self.directory = Path(keys_dir) / subdirectory
        self.recheck_s = recheck_s
        self._by_key: dict[bytes, str] = {}
        self._robots: set[str] = set()
        self._stamp: tuple | None = None
        self._checked = 0.0
        self._lock = threading.Lock()  # the ZAP thread and the ingest thread both refresh
        self._forced = TokenBucket(FORCED_RECHECKS_PER_S, FORCED_RECHECKS_BURST)  # looks an unknown key may force
        self.reload()

    def reload(self) -> None:
        by_key = {}
        for path, robot in key_files(self.directory):
            public = _public_key(path)
            if public is not None:  # else a half-copied file: picked up on the next change
                by_key[public] = robot
        self._by_key = by_key
        self._robots = set(by_key.values())

    def robot_for(self, public_key_z85: bytes, recheck: bool = False) -> str | None:
        """The enrolled robot with this key, or None (unknown or revoked). `recheck`: look at the
        directory now, not only every `recheck_s` (a handshake of a key just enrolled)."""
        self._refresh(force=recheck)
        return self._by_key.get(public_key_z85)

    def robots(self) -> set[str]:
        """The robot ids enrolled now."""
        self._refresh()
        return self._robots

    def _refresh(self, force: bool = False) -> None:
        """Re-read the keys when any file changed: by (name, mtime, size, inode) of every entry, so a
        key rewritten in place (same name, same count, same size) is noticed too. Looked at every
        `recheck_s`, and when forced (a handshake of a key not known yet) as far as the forced
        looks' budget allows: a stranger's handshakes cost a bounded number of listings."""
        now = time.monotonic()
        if now - self._checked < self.recheck_s and not (force and self._spend_forced(now)):
            return
        with self._lock:
            self._checked = now
            stamp = _directory_stamp(self.directory)
            if stamp is None:
                self._by_key, self._robots, self._stamp = {}, set(), None
            elif stamp != self._stamp:
                self._stamp = stamp
                self.reload()

    def _spend_forced(self, now: float) -> bool:
        """Take one forced look (`FORCED_RECHECKS_BURST`, then `FORCED_RECHECKS_PER_S`)."""
        with self._lock:
            return self._forced.take(now)


def _directory_stamp(directory: Path) -> tuple | None:
    """What changes whenever a key file in `directory` is added, removed, replaced or rewritten
    (None: no such directory)."""
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return None
    stamp = []
    for entry in entries:
        try:
            st = entry.stat()
        except FileNotFoundError:  # removed while we looked: the next look sees what replaced it
            continue
        stamp.append((entry.name, st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(sorted(stamp))
