"""Placement rules on plain node dicts (as `ray.nodes()` returns them): what fits, and errors
that name the missing resource and the nodes that exist."""

from __future__ import annotations

import pytest

from user_rl.config import build_config
from user_rl.hal.resources import Demand, PlacementError, check_placement, device_resource, ray_start_command
from user_rl.launch.placement import actor_options, check_cluster, edge_demands, learner_demand, local_resources


def node(name: str, resources: dict[str, float], **labels: str) -> dict:
    return {
        "NodeID": f"{name}-id",
        "NodeManagerAddress": "127.0.0.1",
        "Alive": True,
        "Resources": {"CPU": 1.0, "memory": 1e9, f"node:{name}": 1.0, **resources},
        "Labels": {"user-rl/node": name, "ray.io/node-id": "x", **labels},
    }


CLUSTER = [node("alpha", {"sim:mujoco_reach": 2.0}), node("beta", {"GPU": 1.0}, role="learner")]


def test_device_resources_are_sim_slots_or_one_per_robot() -> None:
    assert device_resource("mujoco_reach", "sim", "arm-0") == "sim:mujoco_reach"
    assert device_resource("so101", "robot", "arm-left") == "robot:arm-left"


def test_a_fleet_that_fits_passes() -> None:
    check_placement(
        [
            Demand("learner", {"GPU": 1.0}, {"role": "learner"}),
            Demand("edge a", {"sim:mujoco_reach": 1.0}),
            Demand("edge b", {"sim:mujoco_reach": 1.0}),
        ],
        CLUSTER,
    )


def test_missing_resource_names_it_and_every_node() -> None:
    with pytest.raises(PlacementError) as err:
        check_placement([Demand("edge arm-left", {"robot:arm-left": 1.0})], CLUSTER)
    text = str(err.value)
    assert "edge arm-left: needs resource 'robot:arm-left', which no node has" in text
    assert (
        "alpha (CPU 1, sim:mujoco_reach 2, user-rl/node=alpha)" in text and "beta (CPU 1, GPU 1, role=learner" in text
    )
    assert "memory" not in text and "node:alpha" not in text  # Ray's bookkeeping is not shown


def test_more_edges_than_slots_and_unknown_labels_are_all_reported() -> None:
    demands = [Demand(f"edge {i}", {"sim:mujoco_reach": 1.0}) for i in range(3)]
    demands.append(Demand("learner", {}, {"user-rl/node": "gamma"}))
    with pytest.raises(PlacementError) as err:
        check_placement(demands, CLUSTER)
    text = str(err.value)
    assert "'sim:mujoco_reach' are all taken by the rest of this launch" in text
    assert text.count("are all taken") == 1  # two of three edges fit
    assert "learner: no node has the labels user-rl/node=gamma" in text


def test_dead_nodes_do_not_count() -> None:
    cfg = build_config({"fleet": {"num_robots": 1}})
    dead = dict(CLUSTER[0], Alive=False)
    with pytest.raises(PlacementError, match="no live node"):
        check_cluster(cfg, [dead])
    check_cluster(cfg, CLUSTER)


def test_a_config_becomes_demands_and_actor_options() -> None:
    cfg = build_config(
        {
            "fleet": {"num_robots": 2, "labels": {"zone": "lab"}},
            "learner": {"device": "cuda", "resources": {"big_ram": 1}, "labels": {"role": "learner"}},
        }
    )
    learner = learner_demand(cfg)
    assert learner.resources == {"big_ram": 1.0, "GPU": 1.0}
    assert actor_options(learner) == {
        "num_cpus": 0,
        "resources": {"big_ram": 1.0},
        "num_gpus": 1.0,
        "label_selector": {"role": "learner"},
    }
    edges = edge_demands(cfg)
    assert [e.what for e in edges] == ["edge mujoco_reach-0", "edge mujoco_reach-1"]
    assert all(e.resources == {"sim:mujoco_reach": 1.0} and e.labels == {"zone": "lab"} for e in edges)
    assert local_resources(build_config({"fleet": {"num_robots": 6}}))["sim:mujoco_reach"] == 6.0


def test_ray_start_command() -> None:
    cmd = ray_start_command({"sim:mujoco_reach": 2.0}, {"user-rl/node": "alpha"}, head=True, port=6390, block=True)
    assert cmd[:4] == ["ray", "start", "--head", "--port"]
    assert '{"sim:mujoco_reach": 2.0}' in cmd and "user-rl/node=alpha" in cmd and cmd[-1] == "--block"
    with pytest.raises(ValueError, match="either the head node"):
        ray_start_command({}, {}, head=True, address="h:1")
