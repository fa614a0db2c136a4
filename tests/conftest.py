"""MuJoCo reads MUJOCO_GL when first imported; choose headless EGL before any test imports it.
Also the fixtures several folders share (a ZeroMQ context, a live ingest served on a thread, the
learning demonstrations' seed) and the `fast` tier: every test not listed in NOT_FAST below."""

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import pytest  # noqa: E402
import zmq  # noqa: E402

# The fast tier (`python -m pytest -m fast -n 2`, under 10 minutes on 2 cores, every package of user_rl
# touched) is every test but these: whole folders or files, or single tests (path::name), each of
# them 15 s or more on 2 cores (a fast run: under 8 minutes). A new test is fast unless listed here;
# CI runs them all.
NOT_FAST = (
    "tests/e2e/",  # whole fleets learning through Ray (the launch is in tests/security/test_security_launch.py)
    "tests/lerobot/",  # LeRobot in an environment of its own (interop stays fast: tests/hal, tests/edge)
    "tests/docs/test_docs_plugin_guides.py",
    "tests/test_readme.py::test_readme_train_command_works_from_a_fresh_clone",
    "tests/test_packaging.py::test_an_edge_only_install_has_neither_ray_nor_mujoco",
    "tests/cloud/test_cloud_bounds.py::test_ten_thousand_unknown_keys_leave_the_gatekeeper_bounded",
    "tests/hal/test_hal_health.py::test_a_robot_that_stops_answering_is_restarted_then_failed",
    "tests/hal/test_hal_real_robot.py::test_a_real_robot_keeps_acting_through_a_learner_outage_with_the_default_config",
    "tests/wire/test_wire_weight_integrity.py::test_hung_edges_lose_their_claim_so_publishing_goes_on_and_they_catch_up",
    "tests/edge/test_edge_async_chunks.py::test_slow_inference_never_stalls_a_50_hz_control_loop",
    "tests/edge/test_teleop_browser.py",
    "tests/edge/test_teleop_console.py::test_eight_robots_on_one_console_and_robot_5_taken_over_in_two_key_presses",
    "tests/edge/test_teleop_console.py::test_stop_all_stops_every_robot_and_rearming_all_needs_the_confirmation",
    "tests/edge/test_teleop_keyboard.py::test_a_keyboard_only_session_takes_over_drives_labels_undoes_discards_stops_and_rearms",
    "tests/edge/test_teleop_keyboard.py::test_a_gamepad_takes_over_drives_labels_and_stops",
    "tests/policies/test_policies_flow.py::test_q_chunking_values_chunks_by_their_reward_and_picks_the_best",
    "tests/hal/test_hal_cluster.py",  # a two-node Ray cluster
    "tests/hal/test_hal_discovery.py::test_entry_point_driver_is_launched",
    "tests/test_packaging.py",  # builds an edge-only virtual environment
    "tests/algos/test_algos_bc.py::test_hg_dagger_learns_the_expert_from_interventions_among_junk_rows",
    "tests/edge/test_edge_adapt.py::test_slow_uplink_makes_the_edge_batch_and_compress_harder_then_recover",
    "tests/edge/test_teleop_connection.py::test_a_page_that_loses_its_connection_fails_safe",
    "tests/edge/test_teleop_authority.py::test_viewers_stop_operators_rearm_with_confirmation_and_cli_stops_need_their_reason",
)


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


# Modules whose tests share a costly module-scoped fixture (a venv, a Ray cluster, LeRobot models or
# runs: 9-45 s each): their tests stay on one worker, so the fixture is built once, not once per worker.
ONE_WORKER_MODULES = (
    "tests/test_packaging.py",
    "tests/hal/test_hal_cluster.py",
    "tests/lerobot/test_lerobot_devices.py",
    "tests/lerobot/test_lerobot_policy.py",
    "tests/lerobot/test_lerobot_record_replay.py",
    "tests/lerobot/test_lerobot_smolvla.py",
)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups off the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test fast but those NOT_FAST names (and the learning demonstrations).

    Under pytest-xdist (`-n 2 --dist loadgroup`, as the README's test command runs the suite), the
    learning demonstrations run one after another on one worker and the other whole fleets one
    after another on the other, each group from the start (xdist hands out the largest group
    first); the rest, most of it waiting on sockets and timeouts, fills in on both. So at most two
    fleets share the cores, and the longest work never starts last."""
    for item in items:
        if item.get_closest_marker("long") is not None:
            item.add_marker(pytest.mark.xdist_group("learning"))
        elif item.nodeid.startswith("tests/e2e/"):
            item.add_marker(pytest.mark.xdist_group("fleets"))
        elif item.nodeid.startswith(ONE_WORKER_MODULES):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        if item.get_closest_marker("long") is None and not item.nodeid.startswith(NOT_FAST):
            item.add_marker(pytest.mark.fast)


@pytest.fixture
def seed_overrides() -> tuple[str, ...]:
    """The learning demonstrations train with the configs' seeds; USER_RL_TEST_SEED=N trains them
    with seed N instead (`seed=N`), to check a bar on several seeds."""
    seed = os.environ.get("USER_RL_TEST_SEED")
    return (f"seed={int(seed)}",) if seed else ()
