"""The benchmarks run end to end at tiny sizes and write their JSON (no timing is checked)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def run_script(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """A bench script run with `args`, its output captured."""
    return subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=timeout)


def run_ok(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """A bench script run with `args` that must succeed (else the test fails with its output)."""
    done = run_script(script, *args, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def run_bench(script: str, out: Path, *args: str) -> dict:
    done = run_ok(script, *args, "--quick", "--out", str(out))
    assert "ratio" in done.stdout
    return json.loads(out.read_text())


def test_insert_bench_reports_rates_and_ratio(tmp_path: Path) -> None:
    result = run_bench("buffer_insert.py", tmp_path / "insert.json")
    assert {
        "config",
        "ours",
        "raw",
        "pwrite",
        "ratio",
        "ratio_vs_pwrite",
        "goal",
        "runs",
        "stored_bytes_per_transition",
    } <= set(result)
    for side in ("ours", "raw", "pwrite"):
        assert {"transitions_per_s", "mb_per_s"} <= set(result[side])
    run = result["runs"][0]
    assert run["ours"]["bytes"] == run["raw"]["bytes"] == run["pwrite"]["bytes"] > 0  # same bytes both ways
    assert result["ratio"] > 0


def test_sample_bench_reports_both_cases(tmp_path: Path) -> None:
    result = run_bench("buffer_sample.py", tmp_path / "sample.json")
    assert set(result["cases"]) == {"warm", "cold_3x"}
    for case in result["cases"].values():
        assert {"raw", "ours", "ratio", "goal", "ram_budget_mb"} <= set(case)
        assert case["ours"]["batches"] > 0 and case["raw"]["batches"] > 0
    cold = result["cases"]["cold_3x"]
    assert {"swaps", "distinct_segments_sampled", "fraction_segments_sampled", "segments"} <= set(cold)
    assert 0 < cold["fraction_segments_sampled"] <= 1
    assert cold["ram_budget_mb"] < cold["data_mb"]


def test_growth_bench_reports_every_size(tmp_path: Path) -> None:
    result = run_bench("buffer_growth.py", tmp_path / "growth.json")
    sizes = result["config"]["sizes"]
    assert sizes == [2000, 10000, 30000]
    assert [r["size"] for r in result["sizes"]] == sizes
    for row in result["sizes"]:
        assert row["stored_from"] >= row["size"] and row["stored"] > row["stored_from"]  # ingesting while sampling
        assert row["ours_ms"] > 0 and row["raw_ms"] > 0 and row["samples"] > 0
        assert row["catalog_rebuilds"] == 0, "appends and seals must never rebuild the sample catalog"
        assert row["ours_max_ms"] >= row["ours_p99_ms"] >= row["ours_ms"] > 0
    assert result["growth_ratio"] > 0 and result["ratio_vs_raw"] > 0
    (beyond,) = result["beyond_budget"]["cases"]  # data larger than the RAM budget: segments swap
    assert beyond["stored"] >= result["beyond_budget"]["transitions"] and beyond["cached_segments"] < beyond["segments"]
    assert beyond["max_ms"] >= beyond["p99_ms"] >= beyond["median_ms"] > 0 and beyond["no_swaps_p99_ms"] > 0
    assert beyond["swaps"] > 0 and beyond["catalog_rebuilds"] == 0, "a swap must not rebuild the sample catalog"
    assert beyond["rows_looked_at_per_swap"] <= beyond["segment_rows"]


def test_update_bench_reports_a_chunk_policys_rate_and_ratio(tmp_path: Path) -> None:
    result = run_bench(
        "policy_updates.py",
        tmp_path / "updates.json",
        str(BENCH.parent / "configs/reach_vla.yaml"),
        "--batch",
        "8",
        "robot.options.image_size=16",
        "policy.freeze=[encoder]",
    )
    assert result["config"]["algo"] == "bc" and result["config"]["policy"]["type"] == "vla"
    assert 0 < result["actor_trainable_parameters"] < result["actor_parameters"]  # the backbone is frozen
    for side in ("ours", "raw"):
        assert result[side]["updates_per_s"] > 0 and result[side]["samples_per_s"] == result[side]["updates_per_s"] * 8
    assert result["ratio"] > 0


def test_update_bench_sets_sac_against_the_plain_sac_loop(tmp_path: Path) -> None:
    """SAC on state vectors is also measured against the textbook SAC loop with networks of the same sizes."""
    result = run_bench(
        "policy_updates.py",
        tmp_path / "updates.json",
        str(BENCH.parent / "configs/reach.yaml"),
        "--device",
        "cpu",
        "--batch",
        "32",
        "--critics",
        "3",
    )
    assert result["config"]["algo"] == "sac"
    assert result["plain_sac"]["updates_per_s"] > 0 and result["ratio_vs_plain_sac"] > 0
    rows = load_bench("run_all.py").policy_updates_rows(result)
    assert rows[1][0].startswith("... vs the plain SAC loop") and rows[1][3] == f"{result['ratio_vs_plain_sac']:.2f}x"
    ensemble = result["ensemble"]  # and the same SAC with three critics against it with two, in the same run
    assert ensemble["critics"] == 3 and ensemble["updates_per_s"] > 0 and ensemble["two_critics_updates_per_s"] > 0
    assert rows[2][0].startswith("... sac with a 3-critic ensemble")
    assert rows[2][1:] == (
        f"{ensemble['updates_per_s']:.1f}",
        f"{ensemble['two_critics_updates_per_s']:.1f}",
        f"{ensemble['ratio_vs_two']:.2f}x",
    )

    import gymnasium as gym
    import torch

    from user_rl.algos import ALGOS

    obs_space = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (18,))})
    action_space = gym.spaces.Box(-1, 1, (3,))
    ours = ALGOS["sac"](obs_space, action_space, "mlp", {"hidden": [64, 64]})
    plain = load_bench("policy_updates.py").PlainSAC(18, 3, [64, 64], torch.device("cpu"))

    def count(*modules) -> int:
        return sum(p.numel() for module in modules for p in module.parameters())

    assert count(ours.actor) == count(plain.actor) and count(ours.critic) == count(plain.q1, plain.q2)
    # the LeanRL-style reference (bench/lean_sac.py) trains networks of the same sizes, and its step learns
    lean = load_bench("lean_sac.py").LeanSAC(18, 3, [64, 64], torch.device("cpu"), compile=False)
    assert count(lean.actor) == count(plain.actor) and sum(p.numel() for p in lean.q_params.values()) == count(
        plain.q1, plain.q2
    )
    torch.manual_seed(0)
    batch = (torch.randn(64, 18), torch.rand(64, 3) * 2 - 1, torch.randn(64), torch.randn(64, 18), torch.zeros(64))
    first = float(lean.step(*batch))
    for _ in range(100):
        last = float(lean.step(*batch))
    assert last < first, "the reference's critic loss must fall on a fixed batch"


def test_gpu_bench_without_a_gpu_says_so_and_the_table_keeps_its_last_rows(tmp_path: Path) -> None:
    """On a box without CUDA, gpu_updates refuses clearly and run_all shows the rows its last GPU run left."""
    import torch

    if torch.cuda.is_available():  # a GPU box runs it for real
        result = run_bench("gpu_updates.py", tmp_path / "gpu.json", "--only", "sac_mlp_128")
        assert result["cases"]["sac_mlp_128"]["config"]["device"].startswith("cuda")
        return
    done = run_script("gpu_updates.py", "--out", str(tmp_path / "gpu.json"), timeout=120)
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr and not (tmp_path / "gpu.json").exists()
    last = json.loads((BENCH / "results/gpu_updates.json").read_text())
    (tmp_path / "gpu_updates.json").write_text(json.dumps(last))
    done = run_ok("run_all.py", "--only", "gpu_updates", "--results", str(tmp_path), timeout=120)
    assert "no CUDA GPU here: gpu_updates not run" in done.stdout
    rows = [line for line in (tmp_path / "RESULTS.md").read_text().splitlines() if line.startswith("| gpu_updates")]
    expected = [
        row for name, case in last["cases"].items() for row in load_bench("run_all.py").policy_updates_rows(case, name)
    ]
    assert len(rows) == len(expected) > len(last["cases"])  # each case's rows: vs the plain step, as written, ...
    assert f"{last['cases']['vla_100m']['ours']['updates_per_s']:.1f}" in rows[-1]


def test_learn_from_demos_reports_success_per_instruction(tmp_path: Path) -> None:
    out = tmp_path / "demos.json"
    run_ok(
        "learn_from_demos.py",
        *("--episodes", "3", "--updates", "4", "--eval-every", "2", "--eval-episodes", "2"),
        *("--out", str(out)),
    )
    result = json.loads(out.read_text())
    assert result["steps"] == 3 * 30  # every step of three 30-step expert episodes
    assert [point["updates"] for point in result["curve"]] == [2, 4]
    assert all(set(point["success"]) == {"red", "green"} for point in result["curve"])


def test_weight_sync_bench_times_every_edge_applying_what_was_published(tmp_path: Path) -> None:
    result = run_bench("weight_sync.py", tmp_path / "sync.json")["results"][0]
    assert result["edges"] == 2 and len(result["rounds"]) == 3  # two warm-up rounds, one steady
    assert result["every_edge_applied_the_published_weights"]  # the bench checks each edge's weights
    assert result["bytes"] >= 2 * result["params"]  # bfloat16
    assert result["ours_s"] > 0 and result["plain_s"] > 0 and result["ratio_vs_plain"] > 0
    assert result["jitter_p99_ms_during_sync"] >= 0 and result["jitter_p99_ms_quiet"] >= 0


def test_one_command_runs_the_benchmarks_and_writes_one_table(tmp_path: Path) -> None:
    done = run_ok("run_all.py", "--quick", "--only", "transport", "link_encryption", "--results", str(tmp_path))
    assert {"transport.json", "link_encryption.json", "RESULTS.md"} <= {p.name for p in tmp_path.iterdir()}
    table = (tmp_path / "RESULTS.md").read_text()
    assert table in done.stdout  # printed as written
    rows = [
        line.split("|")[1:-1]
        for line in table.splitlines()
        if line.startswith("| transport") or line.startswith("| link_encryption")
    ]
    assert len(rows) == 6  # transport: two figures; link_encryption: three links and libsodium's ceiling
    assert any("1 Gbit/s" in row[1] for row in rows) and any("ceiling" in row[1] for row in rows)
    transport = json.loads((tmp_path / "transport.json").read_text())  # ours is checked stored, every transition
    assert rows[0][2].strip() == f"{transport['transitions_per_s']['ours']:,.0f}"
    assert rows[0][4].strip() == f"{transport['ours_vs_plain']:.2f}x"
    sizes = transport["payload_bytes_per_transition"]
    assert sizes["plain"] == sizes["ours"] >= 84 * 84 * 3  # the same bytes both ways, uint8 images
    assert sizes["grpc_torch_save"] > 6 * sizes["ours"]  # float32 images, and the next observation beside each


def load_bench(script: str) -> ModuleType:
    """A bench script as a module (bench/ is not a package), to test its pieces without running it all."""
    spec = importlib.util.spec_from_file_location(f"bench_{script.removesuffix('.py')}", BENCH / script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_sample_efficiency_builds_both_sacs_alike() -> None:
    """The comparison with Stable-Baselines3 is like with like: the same networks, temperature and settings."""
    from stable_baselines3 import SAC as SB3SAC

    from user_rl.algos import ALGOS
    from user_rl.config import build_config
    from user_rl.sim.gym_adapter import GymRobot

    bench = load_bench("sample_efficiency.py")
    schedule = bench.Schedule(steps=2000, eval_every=500, eval_episodes=2, learning_starts=300)
    cfg = build_config(bench.our_config("Hopper-v5", 3, schedule, BENCH / "unused"))
    assert (cfg.stop.max_env_steps, cfg.stop.eval_every_env_steps, cfg.stop.eval_every_s) == (2000, 500, None)
    robot = GymRobot(env_id="Hopper-v5")  # (HalfCheetah's model makes MuJoCo write a warnings file here)
    ours = ALGOS["sac"](
        robot.observation_space,
        robot.action_space,
        "mlp",
        cfg.policy.options(),
        cfg.algo,  # SAC's Settings
    )
    theirs = SB3SAC("MlpPolicy", robot.env, **bench.sb3_kwargs(schedule, 3))
    robot.close()
    assert ours.target_entropy == theirs.target_entropy == -3.0  # -|A|
    assert ours.alpha.item() == pytest.approx(theirs.log_ent_coef.exp().item()) == 1.0
    s = ours.settings
    assert (s.gamma, s.tau, s.actor_lr, s.critic_lr) == (
        theirs.gamma,
        theirs.tau,
        theirs.learning_rate,
        theirs.learning_rate,
    )
    assert (cfg.algo.batch_size, cfg.algo.learning_starts, cfg.algo.utd_ratio) == (
        theirs.batch_size,
        theirs.learning_starts,
        theirs.gradient_steps,
    )

    def sizes(module) -> list[tuple[int, ...]]:
        return sorted(tuple(p.shape) for p in module.parameters())

    def member_sizes(module, members: int = 1) -> list[tuple[int, ...]]:
        # each Q-network's layers, as sizes without unit axes (ours stacks its members along a first axis)
        return sorted(
            tuple(sorted(n for n in p.shape[1 if members > 1 else 0 :] if n != 1))
            for p in module.parameters()
            for _ in range(members)
        )

    # two Q-networks of (256, 256) each
    assert ours.critic.num_critics == 2
    assert member_sizes(ours.critic, 2) == member_sizes(theirs.critic)
    # The actor's (256, 256) trunk alike; its mean and log-std come from one layer here, two there
    assert [s for s in sizes(ours.actor) if 256 in s[:1]] == [s for s in sizes(theirs.actor) if 256 in s[:1]]
    assert sum(p.numel() for p in ours.actor.parameters()) == sum(p.numel() for p in theirs.actor.parameters())


def test_sample_efficiency_evaluates_sb3_where_ours_holds(tmp_path: Path) -> None:
    """SB3 is evaluated at the same env steps with the same updates behind each point as our held fleet
    (steps - learning_starts); a run set against itself has ratio 1 in the JSON and the table."""
    out = tmp_path / "sb3.json"
    run_ok(
        "sample_efficiency.py",
        *("--sb3-run", "InvertedPendulum-v5", "0"),
        *("--steps", "250", "--eval-every", "100", "--learning-starts", "100", "--eval-episodes", "1"),
        *("--out", str(out)),
    )
    run = json.loads(out.read_text())
    assert [(p["env_steps"], p["updates"]) for p in run["points"]] == [(100, 0), (200, 100), (250, 150)]
    assert all(p["mean_return"] > 0 for p in run["points"])  # InvertedPendulum pays 1 per step

    bench = load_bench("sample_efficiency.py")
    schedule = bench.Schedule(steps=250, eval_every=100, eval_episodes=1, learning_starts=100)
    env = bench.summarize("InvertedPendulum-v5", {0: {"ours": run, "sb3": run}}, schedule)
    assert env["final"]["ratio"] == env["auc"]["ratio"] == 1.0
    result = {
        "config": {"points": schedule.points(), "seeds": [0], "eval_episodes": 1, "steps": 250},
        "envs": {"InvertedPendulum-v5": env},
    }
    table = bench.table(result).splitlines()
    assert table[0].split("|")[3:6] == [" 0.1k ", " 0.2k ", " 0.25k "]
    assert table[2].split("|")[-3:-1] == [" 1.00x ", " 1.00x "]
    rows = load_bench("run_all.py").sample_efficiency_rows(result)
    assert [row[3] for row in rows] == ["1.00x", "1.00x"]  # final return and area under the curve
    # over seeds: the mean curve makes the ratios, and each seed's final return shows their spread
    final = run["points"][-1]["mean_return"]
    halved = {**run, "points": [{**p, "mean_return": p["mean_return"] / 2} for p in run["points"]]}
    two = bench.summarize(
        "InvertedPendulum-v5", {0: {"ours": run, "sb3": run}, 1: {"ours": halved, "sb3": run}}, schedule
    )
    assert two["final"]["by_seed"] == {"ours": [round(final, 2), round(final / 2, 2)], "sb3": [round(final, 2)] * 2}
    assert two["final"]["ratio"] == two["auc"]["ratio"] == 0.75
    by_seed = bench.table({**result, "envs": {"InvertedPendulum-v5": two}}).splitlines()[2].split("|")[-4]
    assert by_seed == f" {final:.0f} / {final / 2:.0f} "

    # A comparison stopped part-way resumes from its --runs-dir: finished runs are read back, not rerun
    runs = tmp_path / "runs"
    runs.mkdir()
    for system in ("ours", "sb3"):
        (runs / f"{system}-InvertedPendulum-v5-s0.json").write_text(json.dumps(run))
    schedule_args = [
        "--envs",
        "InvertedPendulum-v5",
        "--seeds",
        "0",
        "--steps",
        "250",
        "--eval-every",
        "100",
        "--learning-starts",
        "100",
        "--eval-episodes",
        "1",
        "--runs-dir",
        str(runs),
    ]
    resumed = run_ok("sample_efficiency.py", *schedule_args, "--out", str(tmp_path / "resumed.json"), timeout=120)
    assert not (runs / "ours-InvertedPendulum-v5-s0").exists()  # nothing was trained again
    resumed_result = json.loads((tmp_path / "resumed.json").read_text())
    assert resumed_result["envs"]["InvertedPendulum-v5"]["final"]["ratio"] == 1.0
    assert resumed_result["runs_read_back"] == 2 and "(2 runs read back)" in resumed.stdout
    other = run_script("sample_efficiency.py", *schedule_args, "--steps", "300", timeout=120)
    assert other.returncode == 2 and "holds runs of another schedule" in other.stderr  # never mixes two schedules


def test_the_steering_bench_counts_what_each_version_carries_to_an_edge() -> None:
    """bench/steering.py's bytes per version (issue 31: at most 2 MB for steering): steering carries its
    small actor only, the fine-tuning baselines the whole flow (and qc the critic it picks with)."""
    bench = load_bench("steering.py")
    sizes = {method: bench.published_bytes(config) for method, config in bench.METHODS.items()}
    assert sizes["dsrl"] == sizes["dsrl_people"] < sizes["residual"] < 2 * 1024 * 1024
    assert 3 * sizes["dsrl"] < sizes["flow_ql"] < sizes["qc"]


def test_the_sac_gap_bench_changes_one_thing_per_variant() -> None:
    """bench/sac_gap.py (issue 34): `std1` starts the actor's std at 1 before the tanh, as SB3's, where
    ours starts near 0.22; `alpha1st` steps the temperature first and backs the critic up with the
    temperature from before that step, as SB3 does; `serial` is the trainer's own SAC, unchanged."""
    import gymnasium as gym
    import numpy as np
    import torch

    bench = load_bench("sac_gap.py")
    env = gym.make("HalfCheetah-v5")
    torch.manual_seed(0)
    serial, std1 = bench.build_sac(env, "serial"), bench.build_sac(env, "std1")
    obs = {"state": torch.zeros(64, env.observation_space.shape[0])}
    assert serial.actor.distribution(obs)[1].mean() < -1.0 < -0.3 < std1.actor.distribution(obs)[1].mean() < 0.3

    replay = bench.Replay(300, env.observation_space.shape[0], env.action_space.shape[0])
    rng = np.random.default_rng(0)
    for _ in range(300):
        replay.add(rng.normal(size=17), rng.uniform(-1, 1, 6), rng.normal(), rng.normal(size=17), False)
    assert replay.sample(256, rng, delay=100)["obs"]["state"].shape == (256, 17)
    before = float(serial.alpha)
    bench.alpha_first_update(serial, replay.sample(256, rng, delay=0))
    assert serial.updates == 1 and float(serial.alpha) != before


@pytest.mark.parametrize("gradients", [True, False], ids=["forward-backward", "no-grad"])
def test_the_critic_ensemble_bench_sets_each_form_against_separate_networks(tmp_path: Path, gradients: bool) -> None:
    out = tmp_path / "ensemble.json"
    args = ["--hidden", "8", "--batch", "4", "--critics", "2", "3", "--rounds", "1", "--burst", "1"]
    done = run_ok("critic_ensemble.py", *args, *([] if gradients else ["--no-grad"]), "--out", str(out))
    result = json.loads(out.read_text())
    forms = {"stacked", "vmap"} if gradients else {"stacked", "ours", "vmap"}  # ours: what q_of runs then
    for count in ("2", "3"):
        assert set(result["critics"][count]["passes_per_s"]) == forms | {"separate"}
        assert all(result["critics"][count][f"{form}_vs_separate"] > 0 for form in forms)
    assert ("without gradients" in done.stdout) != gradients
