"""Config composition and the early checks that run before any model is built."""

import pytest

from harness.commands.cli import main
from harness.config import ConfigError, derive_batch_sizes, validate


def test_defaults_compose_to_grpo_tiny_arith(compose_cfg):
    cfg = compose_cfg()
    assert (cfg.algo.name, cfg.task.name, cfg.model.path, cfg.rollout.backend) == ("grpo", "arith", "tiny", "hf")
    sizes = validate(cfg)
    assert sizes.sequences_per_step == cfg.trainer.prompts_per_step * cfg.algo.samples_per_prompt


def test_algo_fields_are_type_checked(compose_cfg):
    cfg = compose_cfg(["algo.clip_high=0.28"])
    assert cfg.algo.clip_high == 0.28
    with pytest.raises(Exception, match="clip_high"):
        compose_cfg(["algo.clip_high=wide"])
    with pytest.raises(Exception, match="no_such_field"):
        compose_cfg(["algo.no_such_field=1"])


def test_task_preset_sets_checker(compose_cfg):
    cfg = compose_cfg(["task=gsm8k"])
    assert cfg.task.checker == "gsm8k" and "####" in cfg.task.prompt_template


def test_derived_sizes(compose_cfg):
    cfg = compose_cfg(
        ["trainer.prompts_per_step=8", "algo.samples_per_prompt=4", "trainer.sequences_per_minibatch=16",
         "trainer.micro_batch_sequences=4", "algo.epochs=2"]
    )
    s = derive_batch_sizes(cfg)
    assert (s.sequences_per_step, s.minibatches_per_epoch, s.micro_batches_per_minibatch) == (32, 2, 4)
    assert s.optimizer_steps_per_rl_step == 4


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["trainer.prompts_per_step=5", "trainer.sequences_per_minibatch=16"], "trainer.sequences_per_minibatch"),
        (["trainer.sequences_per_minibatch=32", "trainer.micro_batch_sequences=12"], "trainer.micro_batch_sequences"),
        (["algo.samples_per_prompt=0"], "algo.samples_per_prompt"),
        (["model.tiny.hidden_size=64", "model.tiny.num_heads=4"], "head_dim"),
        (["task.checker=nope"], "task.checker"),
        (["trainer.precision=fp8"], "trainer.precision"),
        (["trainer.budget=flops"], "trainer.budget"),
        (["trainer.budget=tokens"], "trainer.budget_tokens"),
        (["trainer.budget=wall_s"], "trainer.budget_wall_s"),
    ],
)
def test_bad_sizes_name_the_field(compose_cfg, overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        validate(compose_cfg(overrides))


def test_cli_bad_batch_size_fails_before_model_build(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    import harness.models

    monkeypatch.setattr(harness.models, "build_tiny", lambda *a, **k: pytest.fail("model built"))
    with pytest.raises(SystemExit, match="sequences_per_minibatch"):
        main(["run", "trainer.prompts_per_step=5", "trainer.sequences_per_minibatch=16"])


def test_cli_unknown_algorithm_lists_registered(capsys):
    with pytest.raises(SystemExit, match=r"unknown algorithm 'nope'.*grpo"):
        main(["run", "algo=nope"])


@pytest.mark.parametrize("argv, message", [
    (["run", "trainer.stepz=3"], "error: trainer.stepz is not a config key; did you mean trainer.steps?"),
    (["run", "trainr.steps=3"], "did you mean trainer.steps?"),
    (["run", "algo=ppo", "algo.critic_lrr=1e-3"], "did you mean algo.critic_lr?"),
    (["run", "algo=grpo", "algo.critic_lr=1e-3"], "algo.critic_lr is not a config key of grpo: a setting of ppo"),
    (["sweep", "algo=grpo,rloo", "trainer.stepz=1"], "did you mean trainer.steps?"),
])  # fmt: skip
def test_cli_a_misspelt_key_gets_one_line_naming_the_nearest(argv, message, tmp_path, monkeypatch):
    """Not Hydra's advice to append the key with '+': the run never starts."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert message in str(exc.value) and "+" not in str(exc.value) and "\n" not in str(exc.value)
    assert not list(tmp_path.iterdir())


def test_cli_keys_of_every_choice_and_open_dicts_pass_the_key_check():
    from harness.commands.cli import check_keys

    check_keys(["algo=grpo,ppo", "algo.critic_lr=1e-3", "trainer.steps=2", "+extra.key=1", "hydra.run.dir=x"])


def test_cli_list_shows_every_registry(capsys):
    main(["list"])
    out = capsys.readouterr().out
    for needle in ("grpo", "arith@1", "gsm8k@", "math@", "tiny", "math500"):
        assert needle in out


def test_cli_run_help_lists_groups(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--help"])
    assert exc.value.code in (0, None)
    out = capsys.readouterr().out
    assert "harness run" in out and "algo" in out and "trainer" in out and "prompts_per_step" in out


def test_keys_added_later_carry_the_config_defaults(compose_cfg):
    """analysis fills harness.rundir.ADDED_KEYS into older run dirs' configs: the values must be what
    a new run's config holds by default (else old and new runs of one setting would not pool)."""
    from omegaconf import OmegaConf

    from harness.rundir.schema import ADDED_KEYS, flatten

    flat = flatten(OmegaConf.to_container(compose_cfg([]), resolve=False))
    for key, value in ADDED_KEYS.items():
        assert flat[key] == value, key


def test_run_names_never_nest_directories():
    """A path value (model.path=/data/m) must not turn the run's folder into nested folders."""
    from harness.config import run_name

    assert run_name("algo=grpo,seed=0") == "algo=grpo,seed=0"
    name = run_name("model.path=/data/m,seed=0")
    assert "/" not in name and name.startswith("model.path=_data_m,seed=0...")
    assert name != run_name("model.path=/data_m,seed=0")  # the hash keeps them apart


def test_renamed_keys_are_refused_naming_the_new_key(compose_cfg, capsys):
    """vLLM-only and rollout-server settings moved to rollout.vllm.* and rollout.server.*: an old key fails in
    one line that names the new one, on the command line and in compose_config alike."""
    with pytest.raises(ConfigError, match=r"rollout.dtype is now rollout.vllm.dtype .*use rollout.vllm.dtype=bfloat16"):
        compose_cfg(["rollout.dtype=bfloat16"])
    with pytest.raises(SystemExit, match=r"rollout.url_retry_s is now rollout.server.retry_s"):
        main(["run", "rollout.url_retry_s=5"])
    cfg = compose_cfg(["rollout.vllm.dtype=bfloat16", "rollout.server.retry_s=5"])
    assert (cfg.rollout.vllm.dtype, cfg.rollout.server.retry_s) == ("bfloat16", 5.0)


def test_an_old_run_dirs_keys_read_under_their_new_names(compose_cfg):
    """A run directory written before the keys moved pools, resumes and is evaluated as a new one: its
    config reads under the new names with the same values (harness.rundir.RENAMED_KEYS)."""
    from omegaconf import OmegaConf

    from harness.rundir.schema import RENAMED_KEYS, flat_config

    new = flat_config(OmegaConf.to_container(compose_cfg([]), resolve=False))
    old_cfg = OmegaConf.to_container(compose_cfg([]), resolve=False)
    for old, renamed in RENAMED_KEYS.items():  # write the config as the old schema had it
        group, leaf = renamed.split(".")[1:]
        old_cfg["rollout"][old.split(".", 1)[1]] = old_cfg["rollout"][group].pop(leaf)
    del old_cfg["rollout"]["vllm"], old_cfg["rollout"]["server"]
    assert flat_config(old_cfg) == new


@pytest.mark.parametrize(
    "override, field",
    [
        ("rollout.vllm.sleep_level=2", "rollout.vllm.sleep_level=2: use 1"),
        ("rollout.vllm.sleep_level=0", "rollout.vllm.sleep_level=0: use 1"),
        ("rollout.vllm.gpu_memory_utilization=0", r"rollout.vllm.gpu_memory_utilization=0.0 must be in \(0, 1\]"),
        ("rollout.vllm.gpu_memory_utilization=1.5", r"rollout.vllm.gpu_memory_utilization=1.5 must be in \(0, 1\]"),
        ("rollout.vllm.dtype=bf16", "rollout.vllm.dtype='bf16' is not a vLLM dtype: use auto, bfloat16"),
        ("rollout.vllm.max_model_len=100", "rollout.vllm.max_model_len=100 < task.max_prompt_tokens"),
        ("rollout.vllm.max_model_len=-1", "rollout.vllm.max_model_len=-1 must be >= 0"),
        ("rollout.vllm.max_num_seqs=0", "rollout.vllm.max_num_seqs=0 must be >= 1"),
        ("rollout.vllm.weight_bucket_mb=0", "rollout.vllm.weight_bucket_mb=0 must be >= 1"),
        ("rollout.vllm.kv_cache_gib=0", "rollout.vllm.kv_cache_gib=0.0 must be > 0"),
        ("rollout.vllm.weight_transport=nfs", "rollout.vllm.weight_transport='nfs': use auto, shm"),
    ],
)
def test_bad_vllm_values_fail_in_one_line_naming_the_field(compose_cfg, override, field):
    """rollout.vllm.* values that would corrupt a run silently (sleep level 2's discarded weights, responses cut
    at max_model_len) or fail only once vLLM is built: refused before any model is built, in one line."""
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as exc:
        validate(compose_cfg(["rollout=vllm", override]))
    assert "\n" not in str(exc.value)


def test_good_vllm_values_pass(compose_cfg):
    validate(compose_cfg(["rollout=vllm"]))  # the defaults
    validate(compose_cfg(["rollout=vllm", "rollout.vllm.sleep_level=1", "rollout.vllm.gpu_memory_utilization=1",
                          "rollout.vllm.dtype=bfloat16", "rollout.vllm.kv_cache_gib=0.5",
                          "task.max_prompt_tokens=256", "rollout.max_response_tokens=256",
                          "rollout.vllm.max_model_len=512", "rollout.vllm.weight_transport=rpc"]))  # fmt: skip
    for dtype in ("auto", "float16", "half", "float32", "float", "BFloat16"):  # vLLM lower-cases it
        validate(compose_cfg(["rollout=vllm", f"rollout.vllm.dtype={dtype}"]))


def test_vllm_checks_only_where_vllm_is_the_engine(compose_cfg):
    """hf ignores rollout.vllm.*; a run on a rollout server uses the server's; `harness serve` never sleeps and
    its clients choose their response lengths, but its engine still needs a sane memory fraction."""
    bad = ["rollout.vllm.sleep_level=2", "rollout.vllm.max_model_len=100"]
    validate(compose_cfg(bad))  # rollout=hf
    validate(compose_cfg(["rollout=vllm", "rollout.server.url=http://127.0.0.1:1", *bad]))
    validate(compose_cfg(["rollout=vllm", *bad]), serving=True)
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.gpu_memory_utilization"):
        validate(compose_cfg(["rollout=vllm", "rollout.vllm.gpu_memory_utilization=2"]), serving=True)


def test_max_model_len_covers_the_longer_eval_responses(compose_cfg):
    base = ["rollout=vllm", "task.max_prompt_tokens=100", "rollout.max_response_tokens=50"]
    validate(compose_cfg([*base, "rollout.vllm.max_model_len=150"]))
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.max_model_len=150 .* = 300"):
        validate(compose_cfg([*base, "rollout.vllm.max_model_len=150", "rollout.eval_max_response_tokens=200"]))
