"""CurveZMQ keys: `keys generate` makes what is missing and never overwrites; the learner's
gatekeeper admits enrolled keys only, names each peer by its robot id, and notices a revocation
without a restart."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from tests.support.messages import first_steps
from user_rl.config import ConfigError, build_config
from user_rl.security.curve import ClientKeys, Gatekeeper, curve_enabled, secure_server
from user_rl.security.keys import KeyPair, enroll, generate, revoke, robot_keys


def test_generate_makes_missing_keys_only_and_keeps_secrets_private(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    written = generate(keys, ["arm-0", "arm-1"])
    names = sorted(p.relative_to(keys).as_posix() for p in written)
    assert names == [
        "enrolled/arm-0.key",
        "enrolled/arm-1.key",
        "learner.key",
        "learner.key_secret",
        "robots/arm-0.key",
        "robots/arm-0.key_secret",
        "robots/arm-1.key",
        "robots/arm-1.key_secret",
    ]
    assert stat.S_IMODE((keys / "robots" / "arm-0.key_secret").stat().st_mode) == 0o600
    before = (keys / "learner.key_secret").read_bytes()
    again = generate(keys, ["arm-1", "arm-2"])  # adds arm-2, touches nothing else
    assert sorted(p.name for p in again) == ["arm-2.key", "arm-2.key", "arm-2.key_secret"]
    assert (keys / "learner.key_secret").read_bytes() == before
    with pytest.raises(ConfigError, match="cannot name a robot key"):
        generate(keys, ["../evil"])


def test_revoke_and_enroll_move_public_keys(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    generate(keys, ["arm-0"])
    assert revoke(keys, "arm-0") == keys / "revoked" / "arm-0.key"
    assert not (keys / "enrolled" / "arm-0.key").exists()
    with pytest.raises(ConfigError, match="'arm-0' is not enrolled .* enrolled: none"):
        revoke(keys, "arm-0")
    # A revoked key stays out for good: enrolling it again is refused, a new keypair is taken.
    with pytest.raises(ConfigError, match="holds a revoked key .*make the robot a new keypair"):
        enroll(keys, "arm-0", keys / "robots" / "arm-0.key")
    assert not (keys / "enrolled" / "arm-0.key").exists()
    (tmp_path / "new").mkdir()
    zmq.auth.create_certificates(tmp_path / "new", "arm-0")
    enroll(keys, "arm-0", tmp_path / "new" / "arm-0.key")
    assert (keys / "enrolled" / "arm-0.key").is_file() and (keys / "revoked" / "arm-0.key").is_file()
    # Revoking the new key too keeps both revoked keys.
    assert revoke(keys, "arm-0") == keys / "revoked" / "arm-0.key.2"
    assert (keys / "revoked" / "arm-0.key").read_bytes() != (keys / "revoked" / "arm-0.key.2").read_bytes()
    with pytest.raises(ConfigError, match="no key file at .*arm-9.key_secret; make keys with"):
        robot_keys(keys, "arm-9")


def test_curve_is_on_by_default_unless_everything_is_loopback() -> None:
    assert not curve_enabled("auto", "127.0.0.1") and not curve_enabled("auto", "tcp://localhost:5555")
    assert curve_enabled("auto", "0.0.0.0") and curve_enabled("auto", "tcp://10.0.0.5:5555")
    assert curve_enabled("on", "127.0.0.1") and not curve_enabled("off", "10.0.0.5")
    # YAML reads a bare on / off as a boolean; the config takes either.
    assert [build_config({}, [f"security.curve={v}"]).security.curve for v in ("on", "off", "auto")] == [
        "on",
        "off",
        "auto",
    ]


@pytest.fixture
def server(tmp_path: Path):
    keys = tmp_path / "keys"
    generate(keys, ["arm-0", "arm-1"])
    context = zmq.Context()
    gate = Gatekeeper(context, keys)
    socket = context.socket(zmq.ROUTER)
    secure_server(socket, gate.keys)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    yield keys, gate, socket, f"tcp://127.0.0.1:{port}", context
    socket.close(0)
    gate.close()
    context.destroy(0)


def connect(context: zmq.Context, address: str, keys: ClientKeys) -> tuple[zmq.Socket, zmq.Socket]:
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    keys.apply(socket)
    socket.connect(address)
    return socket, monitor


def handshake(monitor: zmq.Socket) -> int:
    assert monitor.poll(5000), "no handshake event"
    return recv_monitor_message(monitor)["event"]


def test_enrolled_robot_is_named_by_its_key_and_a_stranger_is_refused(server) -> None:
    keys, gate, socket, address, context = server
    robot, monitor = connect(context, address, ClientKeys.for_robot(keys, "arm-0"))
    assert handshake(monitor) == zmq.EVENT_HANDSHAKE_SUCCEEDED
    robot.send(b"hello")
    assert socket.poll(5000)
    frames = socket.recv_multipart(copy=False)
    # The message names the robot and the key it proved (revocation is by key).
    user_id = frames[0].get("User-Id")
    assert frames[1].bytes == b"hello" and user_id == f"arm-0/{robot_keys(keys, 'arm-0').public.decode()}"
    assert gate.is_enrolled(user_id) and not gate.is_enrolled("arm-0")

    public, secret = zmq.curve_keypair()
    stranger, monitor = connect(context, address, ClientKeys(KeyPair(public, secret), gate.keys.public))
    assert handshake(monitor) == zmq.EVENT_HANDSHAKE_FAILED_AUTH  # the client learns it was refused
    with contextlib.suppress(zmq.Again):  # refused, the socket may have no connection left to queue on
        stranger.send(b"let me in", zmq.NOBLOCK)  # (a blocking send then waits forever: it hung CI once)
    assert not socket.poll(500)
    assert gate.denied[public.decode()] >= 1


def test_a_revoked_key_is_refused_without_a_restart(server) -> None:
    keys, gate, socket, address, context = server
    revoke(keys, "arm-1")
    time.sleep(0.3)  # the enrolment list is re-read at most every 0.2 s
    assert gate.robot_for(robot_keys(keys, "arm-1").public) is None
    robot, monitor = connect(context, address, ClientKeys.for_robot(keys, "arm-1"))
    assert handshake(monitor) == zmq.EVENT_HANDSHAKE_FAILED_AUTH


def test_a_launch_that_would_encrypt_checks_its_keys_before_starting_anything(tmp_path: Path) -> None:
    def launch(keys: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "user_rl.cli",
                "train",
                "configs/reach.yaml",
                "fleet.num_robots=2",
                "learner.host=0.0.0.0",
                f"security.keys_dir={keys}",
                f"run_root={tmp_path / 'runs'}",
            ],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "MUJOCO_GL": "egl"},
        )

    keys = tmp_path / "keys"
    missing = launch(keys)  # not loopback, so security.curve=auto encrypts: the learner needs its keypair
    assert missing.returncode == 2 and f"no key file at {keys}/learner.key_secret" in missing.stderr
    generate(keys, ["mujoco_reach-0"])
    one_short = launch(keys)
    assert one_short.returncode == 2 and "robots/mujoco_reach-1.key_secret" in one_short.stderr
    assert "user-rl keys generate KEYS_DIR ROBOT_ID" in one_short.stderr
    assert not (tmp_path / "runs").exists()  # nothing was started or written


def steps_after_reset(robot, rows: int) -> tuple[int, dict[str, np.ndarray]]:
    """A batch of `rows` steps of episode 0, each with `robot`'s observation after a reset and a zero action."""
    obs, space = robot.reset(), robot.action_space
    return first_steps(
        robot.observation_space, space, rows, lambda _: obs, lambda _: np.zeros(space.shape, space.dtype)
    )


def test_a_revoked_key_stays_out_after_its_robot_is_enrolled_with_a_new_key(tmp_path: Path) -> None:
    """Revocation is of the key, not the name: arm-0's old key, revoked, is refused on its open
    connection and at every new handshake, while arm-0's new key streams."""
    from user_rl.cloud.ingest import Ingest
    from user_rl.edge.link import DataLink, LinkSettings
    from user_rl.hal.registry import make_robot

    keys = tmp_path / "keys"
    generate(keys, ["arm-0"])
    context = zmq.Context()
    gate = Gatekeeper(context, keys)
    ingest = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer", gate=gate)
    robot = make_robot("mujoco_reach", robot_id="arm-0")
    obs_space, action_space = robot.observation_space, robot.action_space
    ingest.open_buffer(obs_space, action_space)

    def link(client: ClientKeys, epoch: int) -> DataLink:
        return DataLink(
            context,
            ingest.endpoint,
            robot.descriptor,
            obs_space,
            action_space,
            epoch=epoch,
            settings=LinkSettings(spool_dir=str(tmp_path / f"spool-{epoch}"), curve=client),
        )

    def send_steps(data_link: DataLink, rows: int = 8) -> None:
        data_link.send_batch(*steps_after_reset(robot, rows))

    def serve_until(condition, what: str, *links: DataLink, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            ingest.poll(10)
            for data_link in links:
                data_link.poll(0)

    old_keys = ClientKeys.for_robot(keys, "arm-0")
    old = link(old_keys, epoch=1)
    new = again = None
    try:
        old.hello()
        send_steps(old)
        serve_until(lambda: old.welcomed and old.unacked == 0, "the old key to stream", old)

        revoke(keys, "arm-0")
        new_public, new_secret = zmq.curve_keypair()
        (tmp_path / "new").mkdir()
        (tmp_path / "new" / "arm-0.key").write_text(f'metadata\ncurve\n    public-key = "{new_public.decode()}"\n')
        enroll(keys, "arm-0", tmp_path / "new" / "arm-0.key")  # the same robot id, a new key
        time.sleep(0.3)  # the enrolment lists are re-read at most every 0.2 s

        # The old key's open connection: its next message is refused, nothing more is stored.
        stored = ingest.robots["arm-0"].transitions
        send_steps(old)
        serve_until(lambda: old.rejects["not_enrolled"] >= 1, "the old key's message to be refused", old)
        assert old.refused is not None and "not_enrolled" in old.refused
        # A new connection with the old key: refused at the handshake.
        again = link(old_keys, epoch=2)
        again.hello()
        serve_until(lambda: again.refused is not None, "the old key's handshake to be denied", again)
        assert again.refused.startswith("key_refused")
        assert gate.denied_report()[0].get("arm-0 (revoked)", 0) >= 1
        # The new key streams.
        new = link(ClientKeys(KeyPair(new_public, new_secret), gate.keys.public), epoch=3)
        new.hello()
        send_steps(new)
        serve_until(lambda: new.welcomed and new.unacked == 0, "the new key to stream", new)
        assert ingest.robots["arm-0"].epoch == 3 and ingest.robots["arm-0"].transitions == stored + 8
        assert ingest.rejected["not_enrolled"] >= 1 and ingest.rejected["wrong_robot"] == 0
    finally:
        for data_link in (old, new, again):
            if data_link is not None:
                data_link.close()
        robot.close()
        ingest.close()
        gate.close()
        context.term()


def test_re_enrolling_a_robot_takes_effect_in_a_running_learner(tmp_path: Path) -> None:
    """`user-rl keys enroll` over a robot's current key (a new keypair made on the robot): the running
    `user-rl learner` admits the new key at its first handshake and refuses the old one, on its open
    connection and at a new handshake, with no restart; a key file rewritten in place by hand
    (same name, size and inode) is noticed too."""
    import signal

    import yaml

    from tests.e2e.harness import learner_status, run_cli, start_learner
    from user_rl.edge.link import DataLink, LinkSettings
    from user_rl.hal.registry import make_robot
    from user_rl.testing.wait import free_port, wait_until

    keys, data_port = tmp_path / "keys", free_port()
    generate(keys, ["arm-0"])
    config = tmp_path / "learner.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "robot": {"type": "mujoco_reach", "options": {"obs_mode": "state"}},
                "algo": {"learning_starts": 10**6},
                "security": {"curve": "on", "keys_dir": str(keys)},
                "learner": {"data_port": data_port, "weights_port": free_port(), "torch_threads": 1},
            }
        )
    )
    robot = make_robot("mujoco_reach", robot_id="arm-0", obs_mode="state")
    obs_space, action_space = robot.observation_space, robot.action_space
    context, links = zmq.Context(), []

    def link(client: ClientKeys, epoch: int) -> DataLink:
        links.append(
            DataLink(
                context,
                f"tcp://127.0.0.1:{data_port}",
                robot.descriptor,
                obs_space,
                action_space,
                epoch=epoch,
                settings=LinkSettings(spool_dir=str(tmp_path / f"spool-{epoch}"), curve=client),
            )
        )
        links[-1].hello()
        return links[-1]

    def send_steps(data_link: DataLink) -> None:
        data_link.send_batch(*steps_after_reset(robot, 4))

    def streamed(data_link: DataLink, what: str, timeout: float = 30.0) -> None:
        """Until every batch of the link is acked, or the learner refused it (which fails)."""
        deadline = time.monotonic() + timeout
        while not (data_link.welcomed and data_link.unacked == 0):
            assert data_link.refused is None, f"{what}: {data_link.refused}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            data_link.poll(20)

    def refused(data_link: DataLink, what: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while data_link.refused is None:
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            data_link.poll(20)
        return data_link.refused

    def keypair(public_file: Path, secret_file: Path) -> ClientKeys:
        public, secret = zmq.auth.load_certificate(secret_file)
        return ClientKeys(KeyPair(public, secret), zmq.auth.load_certificate(keys / "learner.key")[0])

    with open(tmp_path / "learner.log", "ab") as log:
        learner = start_learner(config, tmp_path / "run", log)
        try:
            old_keys = ClientKeys.for_robot(keys, "arm-0")
            old = link(old_keys, epoch=1)
            send_steps(old)
            streamed(old, "the first key to stream")

            # The robot makes itself a new keypair; the operator enrolls its public key over the old one.
            made = tmp_path / "on-the-robot"
            made.mkdir()
            public_file, secret_file = map(Path, zmq.auth.create_certificates(made, "arm-0"))
            enrolled = run_cli("keys", "enroll", str(keys), "arm-0", str(public_file), timeout=60)
            assert enrolled.returncode == 0, enrolled.stderr
            new = link(keypair(public_file, secret_file), epoch=2)  # at once: no wait for the learner's next look
            send_steps(new)
            streamed(new, "the re-enrolled key to be admitted and stream")

            # The old key: refused on its open connection and at a new handshake.
            send_steps(old)
            assert "not_enrolled" in refused(old, "the old key's message to be refused")
            assert refused(link(old_keys, epoch=3), "the old key's handshake").startswith("key_refused")

            # A key file rewritten in place by hand: same name, same size, same inode.
            by_hand = tmp_path / "by-hand"
            by_hand.mkdir()
            third_public, third_secret = map(Path, zmq.auth.create_certificates(by_hand, "arm-0"))
            target = keys / "enrolled" / "arm-0.key"
            inode, new_public = target.stat().st_ino, zmq.auth.load_certificate(public_file)[0].decode()
            target.write_text(
                target.read_text().replace(new_public, zmq.auth.load_certificate(third_public)[0].decode())
            )
            assert target.stat().st_ino == inode
            third = link(keypair(third_public, third_secret), epoch=4)
            send_steps(third)
            streamed(third, "the key rewritten in place to be admitted")

            # The learner's status: every admitted key's steps stored, the old key's handshake refused.
            def status() -> dict:
                return learner_status(tmp_path / "run")

            wait_until(
                lambda: (status()["robots"].get("arm-0") or {}).get("transitions") == 12,
                30,
                "the status to show the three admitted keys' steps",
            )
            assert status()["keys_refused_total"] >= 1 and status()["rejected"] == {"not_enrolled": 1}
        finally:
            for data_link in links:
                data_link.close()
            robot.close()
            context.term()
            learner.send_signal(signal.SIGTERM)
            learner.wait(120)
    assert learner.returncode == 0, (tmp_path / "learner.log").read_text()[-2000:]


def test_handshakes_of_unknown_keys_cost_a_bounded_number_of_directory_looks(tmp_path: Path, monkeypatch) -> None:
    """A stranger trying keys makes the gatekeeper look at enrolled/ again, but only within a budget."""
    from user_rl.security import keys as keys_module

    generate(tmp_path / "keys", ["arm-0"])
    looks = []
    real = keys_module._directory_stamp
    monkeypatch.setattr(keys_module, "_directory_stamp", lambda d: looks.append(d) or real(d))
    enrolment = keys_module.Enrolment(tmp_path / "keys", recheck_s=3600.0)
    started = time.monotonic()
    for _ in range(5000):
        assert enrolment.robot_for(zmq.curve_keypair()[0], recheck=True) is None
    elapsed = time.monotonic() - started
    assert len(looks) <= keys_module.FORCED_RECHECKS_BURST + keys_module.FORCED_RECHECKS_PER_S * elapsed + 1
