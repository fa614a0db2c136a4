"""MuJoCo reads MUJOCO_GL when first imported; choose headless EGL before any test imports it.
Also the fixtures several folders share: a ZeroMQ context and a live ingest served on a thread."""

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import pytest  # noqa: E402
import zmq  # noqa: E402


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.term()


@pytest.fixture
def ingest(context: zmq.Context, tmp_path):
    from user_rl.cloud.ingest import Ingest
    from user_rl.testing.wait import serving

    ing = Ingest(context, "tcp://127.0.0.1:0", tmp_path / "buffer")
    assert ing.endpoint.startswith("tcp://127.0.0.1:") and not ing.endpoint.endswith(":0")
    with serving(lambda: ing.poll(50)) as crashed:  # the test fails if the serving loop ever dies
        yield ing
    ing.close()
    assert not crashed, crashed


def pytest_collection_finish(session: pytest.Session) -> None:
    """LeRobot tests run in an environment of their own (tests/support/lerobot_env.py): start
    building it now, in the background, so it is ready by the time they run."""
    if any("tests/lerobot/" in item.nodeid for item in session.items):
        from tests.support import lerobot_env

        lerobot_env.start_in_background()
