"""Shared fixtures: offline mode, a per-session model cache, config composition."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two test processes side by side on 2 cores (make test: pytest -n 2): one thread each, for
    # this process's torch (runtime.threads=0 = torch's default) and the commands it starts.
    # Two processes of 2 threads on 2 cores spin against each other (a 0.25 s step became 10-40 s).
    os.environ["OMP_NUM_THREADS"] = "1"

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")

# Small, fast settings for end-to-end runs in tests (the real defaults train longer).
FAST_RUN = [
    "model.tiny.sft_steps=20",
    "trainer.steps=3",
    "trainer.prompts_per_step=4",
    "algo.samples_per_prompt=4",
    "trainer.micro_batch_sequences=8",
    "trainer.eval_every=2",
    "task.eval_prompts=8",
    "task.train_size=400",
    "rollout.max_response_tokens=6",
]


# The tests that take minutes, longest first (their seconds in CI on the 2-core Xeon, 2026-12-03, two
# at a time, unless noted): two test processes (pytest -n 2) then finish together instead of one of them running a
# 5-minute test alone at the end. The rest keep their order, after these.
SLOWEST_FIRST = {
    "test_algorithm_learns_arith_from_the_reward_model_alone": 900, "test_algorithm_learns_arith[remax]": 300,
    "test_algorithm_learns_arith[ppo]": 302, "test_documented_commands_run[reward_models]": 278,
    "test_documented_commands_run[reasoning]": 250, "test_documented_commands_run[controls]": 45,
    "test_the_clip_binds_in_the_clip_higher_regime": 60, "test_documented_commands_run[sweeps]": 197,
    "test_algorithm_learns_arith[grpo]": 177, "test_documented_commands_run[distillation]": 156,
    "test_grpo_with_lora_learns_arith": 150, "test_algorithm_learns_arith[dapo]": 146,
    "test_reward_model_ranks_held_out_arith_pairs": 144, "test_documented_commands_run[data]": 35,
    "test_algorithm_learns_arith[prime]": 135, "test_newer_algorithms_learn_the_reasoning_testbed": 120,
    "test_grpo_learns_to_work_problems_out": 118, "test_grpo_learns_the_reasoning_testbed_with_partial_rollouts": 110, "test_documented_commands_run[quick_then_eval]": 114,
    "test_algorithm_learns_arith[": 104, "test_documented_commands_run[runs]": 105,
    "test_grpo_learns_arith_with_rollout_ahead_of_training": 90, "test_documented_commands_run[": 80,
    "test_sbatch_template_runs_harness": 76, "test_parallel_sweep_then_relaunch": 66,
    "test_preempted_slurm_job_requeues": 61, "test_grpo_learns_to_use_the_calculator": 57,
    "test_two_node_slurm_runs_ray_slurm_sbatch": 70, "test_a_rollout_server_on_another_host": 50,
    "test_ray_across_two_hosts": 40, "test_partial_rollouts_through_a_rollout_server": 25,
    "test_six_steps_are_bitwise_reproducible": 35,  # measured 2026-12-04, serially
    # Added from CI's durations on a 2-core AMD EPYC Zen 3, 2026-12-07 (cecd437: make test-learning ran these two
    # last, so one process ran the 247-s stage alone for minutes; the others ran mid-tier in file order).
    "test_the_warmstart_stage_passes_where_grpo_learns": 247, "test_the_warmstart_stage_fails_a_run_that_does_not": 80,
    "test_per_rank_memory_falls_with_the_world_size": 95, "test_ray_two_workers_end_to_end_matches": 51,
    "test_the_pins_hold_on_another_cpu_kinds_kernels": 47, "test_killing_the_server_mid_run": 42,
    "test_two_workers_match_one_worker": 36, "test_check_reruns_and_catches_a_shifted_algorithm": 30,
    "test_a_plugin_rollout_backend_runs_end_to_end": 29, "test_sigkill_then_resume_matches": 29,
    "test_the_dry_run_passes_every_check": 25, "test_the_cap_truncates_in_the_overlong_regime": 25,
    "test_ratios_leave_one_at_two_passes": 24,
    # rloo's learning test at 300 steps (2026-12-07): the tier's slowest on a 2-core Xeon that day (117 s, prime 96 s),
    # in this table's scale (prime 135 s) about 170
    "test_algorithm_learns_arith[rloo]": 170,
}  # fmt: skip


def _known_seconds(item) -> int:
    return max((s for name, s in SLOWEST_FIRST.items() if name in item.nodeid), default=0)


_GROUPS_BROKEN = pytest.StashKey[bool]()  # set when xdist's --dist loadgroup does not group (below)


def pytest_itemcollected(item):
    """A learning run is an integration test too: the fast tier (make test-fast, -m "not integration") never runs
    one, whether or not its module says so (two learning tests once ran there, 4 of its 8 minutes)."""
    if item.get_closest_marker("learning") and not item.get_closest_marker("integration"):
        item.add_marker(pytest.mark.integration)


@pytest.hookimpl(trylast=True)  # after xdist's own, which marks each grouped test's node id "...@group"
def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: -_known_seconds(item))  # stable: the rest keep their order
    grouped = [item for item in items if item.get_closest_marker("xdist_group")]
    if getattr(config.option, "loadgroup", False) and grouped and "@" not in grouped[0].nodeid:
        # pytest-xdist#1386: with pytest 9.2 `--dist loadgroup` stops grouping, silently; the tests of one
        # group (one private Ray at a time; one-node SLURM jobs; the global namespace hosts) would then run
        # side by side and trip over each other. They fail instead.
        config.stash[_GROUPS_BROKEN] = True


def pytest_runtest_setup(item):
    if item.config.stash.get(_GROUPS_BROKEN, False) and item.get_closest_marker("xdist_group"):
        pytest.fail("pytest-xdist's --dist loadgroup does not group tests with this pytest (pytest-xdist#1386), so this "
                    "test could run beside one it must not: install pyproject.toml's pin (pytest<9.2)")


@pytest.fixture(scope="session", autouse=True)
def _model_cache(tmp_path_factory):
    """Tiny models built by tests go to a throwaway cache, shared by the session."""
    if "HARNESS_CACHE" not in os.environ:
        base = tmp_path_factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):
            base = base.parent  # shared by the test processes (builds are file-locked: harness/models.py)
        (base / "harness_cache").mkdir(exist_ok=True)
        os.environ["HARNESS_CACHE"] = str(base / "harness_cache")
    yield


def compose(overrides: list[str] | None = None):
    """The composed Hydra config, as `harness run OVERRIDES` would see it."""
    from harness.config import compose_config

    return compose_config(overrides)


@pytest.fixture
def shared_data():
    if not os.path.isdir(SHARED_DATA):
        pytest.skip("../shared/data is not present")
    return os.path.abspath(SHARED_DATA)


@pytest.fixture
def compose_cfg():
    return compose


@pytest.fixture
def fast_run():
    return list(FAST_RUN)
