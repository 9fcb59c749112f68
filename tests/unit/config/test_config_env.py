"""Headless configuration: every config key from SWARM_NODE_<SECTION>__<KEY> environment variables."""
import subprocess
import sys
from pathlib import Path

import pytest

from node.config.schema import ConfigError, env_overrides, load_config

from tests.support.processes import repo_env

ROOT = Path(__file__).resolve().parents[3]


def test_environment_sets_any_key_with_typed_values():
    env = {"SWARM_NODE_SWARM__EXTERNAL_PER_ROUND": "2", "SWARM_NODE_SAMPLING__TEMPERATURE": "0.7",
           "swarm_node_swarm__peers": '["/ip4/127.0.0.1/tcp/5/p2p/x"]',  # names are case-insensitive
           "SWARM_NODE_TASKS__DATASETS__COPY": "3.0",  # nested below a free-form table
           "SWARM_NODE_LOSS__OFF_POLICY__NEG_DAMPING": "0.25", "HOME": "/ignored", "SWARM_NODE_CACHE": "/not/a/key"}
    cfg = load_config("tiny", None, [], environ=env)
    assert cfg.swarm.external_per_round == 2 and isinstance(cfg.swarm.external_per_round, int)
    assert cfg.sampling.temperature == pytest.approx(0.7)
    assert cfg.swarm.peers == ["/ip4/127.0.0.1/tcp/5/p2p/x"]
    assert cfg.tasks.datasets == {"copy": 3.0, "succ": 1.0, "max": 1.0}  # merged into the preset's mixture
    assert cfg.loss.off_policy.neg_damping == 0.25  # three levels deep
    assert cfg.swarm.name == "main"  # untouched keys keep their defaults
    assert load_config("tiny").swarm.external_per_round == 4  # no environ given: the environment is not read


def test_precedence_defaults_preset_file_environment_set(tmp_path):
    toml = tmp_path / "node.toml"
    toml.write_text("[optim]\nlr = 0.005\nepochs = 2\nminibatches = 3\n")
    env = {"SWARM_NODE_OPTIM__LR": "0.002", "SWARM_NODE_OPTIM__EPOCHS": "4"}
    cfg = load_config("tiny", toml, ["optim.lr=3e-4"], environ=env)
    assert cfg.optim.lr == pytest.approx(3e-4)  # --set beats the environment
    assert cfg.optim.epochs == 4  # the environment beats the file
    assert cfg.optim.minibatches == 3  # the file beats the preset
    assert cfg.model.name == "tiny"  # the preset beats the defaults


def test_unknown_variables_name_the_variable_and_the_valid_keys():
    with pytest.raises(ConfigError) as err:
        load_config("tiny", None, [], environ={"SWARM_NODE_SWARM__EXTERNAL_PER_RUOND": "2"})
    message = str(err.value)
    assert "SWARM_NODE_SWARM__EXTERNAL_PER_RUOND" in message and "external_per_round" in message
    assert "listen" in message  # the valid keys of that section
    with pytest.raises(ConfigError) as err:
        env_overrides({"SWARM_NODE_TEMPERATURE": "0.7"})  # no section: one underscore pair missing
    message = str(err.value)
    assert "SWARM_NODE_TEMPERATURE" in message and "SWARM_NODE_<SECTION>__<KEY>" in message
    assert "sampling" in message and "SWARM_NODE_CACHE" in message
    with pytest.raises(ConfigError, match="SWARM_NODE_NETWORK__PEERS.*valid keys at top level"):
        env_overrides({"SWARM_NODE_NETWORK__PEERS": "[]"})
    with pytest.raises(ConfigError, match="SWARM_NODE_SWARM__.*not a config key"):
        env_overrides({"SWARM_NODE_SWARM__": "1"})


def test_bad_value_from_the_environment_is_named():
    with pytest.raises(ConfigError, match="sampling.group_size"):
        load_config("tiny", None, [], environ={"SWARM_NODE_SAMPLING__GROUP_SIZE": "1"})


def test_cli_reads_the_environment_and_set_still_wins():
    env = repo_env(PYTHONHASHSEED="0", SWARM_NODE_SWARM__EXTERNAL_PER_ROUND="2",
                   SWARM_NODE_SAMPLING__TEMPERATURE="0.7")
    out = subprocess.run([sys.executable, "-m", "node.cli", "config", "--set", "sampling.temperature=0.5"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = set(out.stdout.splitlines())
    assert "swarm.external_per_round = 2" in lines and "sampling.temperature = 0.5" in lines
    assert 'swarm.listen = ["/ip4/0.0.0.0/tcp/0"]' in lines  # free port by default
    bad = subprocess.run([sys.executable, "-m", "node.cli", "config"], cwd=ROOT, capture_output=True, text=True,
                         env={**env, "SWARM_NODE_SWARM__MIXX": "4/4"}, timeout=60)
    assert bad.returncode == 2 and "SWARM_NODE_SWARM__MIXX" in bad.stderr and "Traceback" not in bad.stderr


def test_nested_swarm_sections_from_the_environment_and_back():
    """SWARM_NODE_SWARM__PEER_CACHE__MAX_PEERS: one `__` per level; `config --env` writes them so."""
    from node.config.env_file import render_env_file

    env = {"SWARM_NODE_SWARM__PEER_CACHE__MAX_PEERS": "9", "SWARM_NODE_SWARM__INGEST__MODE": "inline",
           "SWARM_NODE_SWARM__P2PD__CONN_HIGH": "0"}
    cfg = load_config("tiny", None, [], environ=env)
    assert (cfg.swarm.peer_cache.max_peers, cfg.swarm.ingest.mode, cfg.swarm.p2pd.conn_high) == (9, "inline", 0)
    active = [line for line in render_env_file(cfg, load_config("tiny"), "tiny").splitlines()
              if line.startswith("SWARM_NODE_SWARM__")]
    assert sorted(active) == sorted(f"{k}={v}" for k, v in env.items())
    with pytest.raises(ConfigError, match="SWARM_NODE_SWARM__PEER_CACHE__MAX_PEERS"):
        load_config("tiny", None, [], environ={"SWARM_NODE_SWARM__PEER_CACHE_MAX_PEERS": "9"})
