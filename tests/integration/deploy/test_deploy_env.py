"""`swarm-node config --env` and the committed scripts/deploy/swarm-node.env.example: the file is
exactly what the command prints (it cannot drift from the config schema), it names every key once,
and loading it gives the preset's configuration."""
import subprocess
import sys

import pytest

from tests.support.env_files import EXAMPLE, ROOT, clean_environ, read_env_file
from node.config.schema import ConfigError, env_overrides, explain, load_config
from node.config.env_file import env_name, env_value, render_env_file

from tests.support.processes import repo_env

EXAMPLE_PRESET = "smollm2"


def cli(*args: str, environ: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env=repo_env(environ, PYTHONHASHSEED="0"), timeout=120)


def test_committed_example_is_what_the_command_prints():
    out = cli("config", "--env", "--preset", EXAMPLE_PRESET, environ=clean_environ())
    assert out.returncode == 0, out.stderr
    assert EXAMPLE.read_text() == out.stdout, (
        f"{EXAMPLE.relative_to(ROOT)} is stale: regenerate it with "
        f"`swarm-node config --env --preset {EXAMPLE_PRESET} > {EXAMPLE.relative_to(ROOT)}`")


def test_example_names_every_key_once_commented_out_with_the_operator_keys_first():
    text = EXAMPLE.read_text()
    keys = [key for key, _, _ in explain(load_config(EXAMPLE_PRESET))]
    assigned = list(read_env_file(text, uncomment=True))
    assert sorted(assigned) == sorted(["SWARM_NODE_PRESET", *(env_name(k) for k in keys)])
    assert assigned[1:6] == [env_name(k) for k in ("swarm.peers", "swarm.name", "swarm.listen",
                                                   "swarm.identity", "run.rounds")]
    assert read_env_file(text) == {"SWARM_NODE_PRESET": EXAMPLE_PRESET}  # every config key commented out
    for value in read_env_file(text, uncomment=True).values():  # where systemd and docker read differently
        assert "\\" not in value and value[:1] not in ("'", '"'), value


@pytest.mark.slow
def test_example_uncommented_loads_the_preset_configuration():
    env = read_env_file(EXAMPLE.read_text(), uncomment=True)
    settings = env_overrides(env)
    assert len(settings) == len([v for v in env.values() if v]) - 1  # each non-empty key is applied (not PRESET)
    assert load_config(env["SWARM_NODE_PRESET"], None, [], environ=env) == load_config(EXAMPLE_PRESET)
    # the command line too, its preset from SWARM_NODE_PRESET alone
    loaded = cli("config", environ={**clean_environ(), **env})
    expected = cli("config", "--preset", EXAMPLE_PRESET, environ=clean_environ())
    assert loaded.returncode == 0 and expected.returncode == 0, loaded.stderr + expected.stderr
    assert loaded.stdout == expected.stdout and 'model.name = "smollm2"' in loaded.stdout.splitlines()


def test_changed_keys_are_uncommented_and_load_back():
    cfg = load_config("tiny", None, ["swarm.name=lab", 'swarm.listen=["/ip4/0.0.0.0/tcp/4001"]', "run.threads=2",
                                     "tasks.datasets.copy=3.0"])
    text = render_env_file(cfg, load_config("tiny"), "tiny")
    active = read_env_file(text)
    assert active == {"SWARM_NODE_SWARM__NAME": "lab", "SWARM_NODE_SWARM__LISTEN": '["/ip4/0.0.0.0/tcp/4001"]',
                      "SWARM_NODE_RUN__THREADS": "2",
                      "SWARM_NODE_TASKS__DATASETS": "{copy = 3.0, succ = 1.0, max = 1.0}"}
    assert "# SWARM_NODE_PRESET=tiny" in text.splitlines()  # the default preset needs no line
    assert load_config("tiny", None, [], environ=active) == cfg
    assert load_config("tiny", None, [], environ=read_env_file(text, uncomment=True)) == cfg


def test_values_systemd_and_docker_would_read_differently_are_refused():
    assert env_value("run.threads", None) == ""
    assert env_value("swarm.control", "127.0.0.1:0") == "127.0.0.1:0"  # bare: not TOML, so read as a string
    assert env_value("optim.betas", (0.9, 0.999)) == "[0.9, 0.999]"
    for text in ("1", "true", "", " padded", '"quoted"', "back\\slash"):
        with pytest.raises(ConfigError, match="TOML file"):
            env_value("swarm.name", text)


def test_empty_variables_are_not_settings_but_their_names_are_checked():
    env = {"SWARM_NODE_RUN__THREADS": "", "SWARM_NODE_SWARM__NAME": "  "}
    assert load_config("tiny", None, [], environ=env) == load_config("tiny")
    with pytest.raises(ConfigError, match="SWARM_NODE_RUN__THREDS"):
        load_config("tiny", None, [], environ={"SWARM_NODE_RUN__THREDS": ""})


@pytest.mark.slow
def test_preset_from_the_environment_and_the_command_line_beats_it():
    environ = {**clean_environ(), "SWARM_NODE_PRESET": "smollm2"}
    out = cli("config", environ=environ)
    assert out.returncode == 0 and 'model.name = "smollm2"' in out.stdout.splitlines(), out.stderr
    out = cli("config", "--preset", "tiny", environ=environ)
    assert 'model.name = "tiny"' in out.stdout.splitlines(), out.stderr
    bad = cli("config", environ={**environ, "SWARM_NODE_PRESET": "smol"})
    assert bad.returncode == 2 and "SWARM_NODE_PRESET='smol'" in bad.stderr and "Traceback" not in bad.stderr
