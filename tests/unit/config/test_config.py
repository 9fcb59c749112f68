"""Config: presets, TOML, --set overrides, and errors that name the valid choices."""
from pathlib import Path

import pytest

from node.config.schema import PRESETS, ConfigError, explain, load_config, parse_override


def test_presets_validate_and_differ():
    tiny, smol = load_config("tiny"), load_config("smollm2")
    assert tiny.model.name == "tiny" and tiny.sampling.max_new_tokens == 1
    assert smol.model.name == "smollm2" and smol.tasks.source == "reasoning_gym"


def test_override_precedence_preset_then_file_then_set(tmp_path):
    toml = tmp_path / "node.toml"
    toml.write_text('[optim]\nlr = 0.005\nepochs = 2\n[tasks]\ndatasets = { add = 1.0 }\n')
    cfg = load_config("tiny", toml, ["optim.lr=3e-4", "loss.name=minpro", "loss.knobs.eps_high=0.3"])
    assert cfg.optim.lr == pytest.approx(3e-4)  # --set beats the file
    assert cfg.optim.epochs == 2  # the file beats the preset
    assert cfg.tasks.datasets == {"add": 1.0}  # a mixture is replaced whole, not merged
    assert cfg.loss.name == "minpro" and cfg.loss.knobs == {"eps_high": 0.3}
    assert cfg.sampling.max_new_tokens == PRESETS["tiny"]["sampling"]["max_new_tokens"]


def test_override_values_are_typed():
    assert parse_override("run.rounds=7") == (["run", "rounds"], 7)
    assert parse_override("optim.autocast_bf16=true") == (["optim", "autocast_bf16"], True)
    assert parse_override("model.name=smollm2") == (["model", "name"], "smollm2")


def test_unknown_set_key_lists_valid_keys():
    with pytest.raises(ConfigError) as err:
        load_config("tiny", None, ["optim.learning_rate=1"])
    assert "optim.learning_rate" in str(err.value) and "lr" in str(err.value) and "epochs" in str(err.value)


def test_unknown_section_in_file_lists_valid_keys(tmp_path):
    toml = tmp_path / "bad.toml"
    toml.write_text("[optimizer]\nlr = 1\n")
    with pytest.raises(ConfigError) as err:
        load_config("tiny", toml)
    assert "optimizer" in str(err.value) and "optim" in str(err.value)


def test_bad_values_and_missing_things_are_named(tmp_path):
    with pytest.raises(ConfigError, match="presets are"):
        load_config("huge")
    with pytest.raises(ConfigError, match="not found"):
        load_config("tiny", tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="group_size"):
        load_config("tiny", None, ["sampling.group_size=1"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config("tiny", None, ["optim.lr"])


def test_cli_preset_choices_match_presets():
    from node.cli import build_parser

    action = next(a for a in build_parser()._subparsers._group_actions[0].choices["train"]._actions
                  if a.dest == "preset")
    assert sorted(action.choices) == sorted(PRESETS)


def test_objectives_are_checked_when_the_config_loads_in_one_line():
    for override, expected in (("loss.name=grpoo", "unknown objective 'grpoo'"),
                               ("loss.external=nope", "unknown objective 'nope'"),
                               ("loss.name=tis(minpro)", "corrects the sampler mismatch twice"),
                               ("loss.knobs={beta = 0.1}", "unknown knob(s) ['beta']"),
                               ("loss.external_knobs={kl_max = -1}", "kl_max")):
        with pytest.raises(ConfigError) as err:
            load_config("tiny", None, [override, "loss.external=ftis"] if "kl_max" in override else [override])
        assert expected in str(err.value) and "\n" not in str(err.value), override


def test_every_knob_is_documented_and_explained(capsys):
    from node.cli import main

    for preset in PRESETS:
        undocumented = [key for key, _, description in explain(load_config(preset)) if not description]
        assert undocumented == [], f"{preset}: knobs without a description: {undocumented}"
    assert main(["config", "--explain", "--set", "loss.external=ftis"]) == 0
    out = capsys.readouterr().out
    assert 'loss.external = "ftis"' in out and "# objective for peers' samples" in out
    assert "hints.anneal_threshold = 0.35" in out and "allocation.scheme = \"off\"" in out


def test_switching_task_source_drops_the_presets_ood_families_unless_named():
    """smollm2's OOD family (reasoning-gym chain_sum) does not exist on the synthetic source: a run that
    switches source without naming eval.ood evaluates no OOD family instead of failing at start."""
    assert "chain_sum" in load_config("smollm2").eval.ood
    switched = load_config("smollm2", None, ["tasks.source=synthetic", "tasks.datasets={add = 1.0}"])
    assert switched.eval.ood == {}
    named = load_config("smollm2", None, ["tasks.source=synthetic", "tasks.datasets={add = 1.0}",
                                          "eval.ood={max = 1.0}"])
    assert named.eval.ood == {"max": 1.0}
    assert load_config("tiny").eval.ood == {"add": 1.0}  # same source: kept


def _torch_loaded_by(code: str) -> str:
    """Runs `code` in a fresh interpreter; returns its output if torch (or transformers) got imported."""
    import subprocess
    import sys

    check = "; import sys; print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers'}))"
    result = subprocess.run([sys.executable, "-c", code + check], cwd=Path(__file__).resolve().parents[3],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return "" if result.stdout.strip().endswith("[]") else result.stdout + result.stderr


def test_the_command_line_parses_without_loading_torch():
    """`swarm-node status` and friends pay only for what they use: the preset names come from
    node/config/presets.py, which imports nothing."""
    assert not _torch_loaded_by("import node.cli; node.cli.build_parser(); node.cli._user_errors()")


def test_the_config_its_registry_and_the_control_client_load_without_torch():
    """The schema (every section, the presets, the objective registry's names and knobs) and
    node.json's writer and reader are torch-free, so `swarm-node config` and `status` start fast."""
    assert not _torch_loaded_by(
        "import node.config.schema, node.observe.control, node.config.env_file, policy.settings, policy.ground; "
        "from policy.loss_knobs import OBJECTIVE_KNOBS, check_objective; "
        "[node.config.schema.load_config(p) for p in node.config.schema.PRESETS]; "
        "assert check_objective('tis(mc(dapo))', inner={'inner': {'eps_high': 0.5}}).extra_samples == 1")


def test_swarm_node_config_and_its_errors_run_without_torch():
    """The whole `swarm-node config` command, a valid one and one with a bad objective: the heavy
    imports wait until a command has a valid config and needs a model (node/cli.py)."""
    assert not _torch_loaded_by(
        "import node.cli; "
        "assert node.cli.main(['config', '--preset', 'smollm2', '--explain']) == 0; "
        "assert node.cli.main(['config', '--env']) == 0; "
        "assert node.cli.main(['config', '--set', 'loss.name=tis(minpro)']) == 2")


def test_the_peer_completion_cap_leaves_room_for_re_encoding_unless_set():
    """Our re-encoding of an honest peer's text can be longer than the tokens it sampled
    (tests/unit/policy/test_generation.py measures it on SmolLM2): the default cap has an eighth of slack."""
    assert load_config("smollm2", None, ["sampling.max_new_tokens=48"]).max_external_tokens == 54
    assert load_config("tiny", None, []).max_external_tokens == 1  # one token: no room for an eighth
    assert load_config("smollm2", None, ["swarm.max_external_tokens=48"]).max_external_tokens == 48


# --- swarm's nested sections (node/config/swarm.py) -------------------------------------------------
def test_swarm_sections_map_one_to_one_onto_their_option_types():
    """Every key of swarm.peer_cache / p2pd / ingest / pool / admission is a field (or keyword
    parameter) of what it configures, so the section is passed whole, never copied field by field."""
    import dataclasses
    import inspect

    from node.peers.admission import Admission
    from node.peers.ingest import IngestBudget
    from node.peers.pool import GroupPool
    from node.service.network import p2pd_options
    from protocol.transports.options import P2pdOptions
    from protocol.transports.p2pd.peer_cache import PeerCacheLimits

    s = load_config("tiny", None, ["swarm.peer_cache.max_peers=9", "swarm.p2pd.conn_low=2",
                                   "swarm.ingest.staged_max=77", "swarm.ingest.max_wait_s=0.5",
                                   "swarm.pool.max_per_sender=3", "swarm.admission.dedup_rounds=11"]).swarm
    fields = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (PeerCacheLimits, P2pdOptions, IngestBudget)}
    params = {cls: set(inspect.signature(cls).parameters) for cls in (GroupPool, Admission)}
    for section, target, extra in ((s.peer_cache, fields[PeerCacheLimits], {"enabled"}),
                                   (s.p2pd, fields[P2pdOptions], set()), (s.ingest, fields[IngestBudget], {"mode"}),
                                   (s.pool, params[GroupPool], set()), (s.admission, params[Admission], set())):
        assert set(type(section).model_fields) - extra <= target, type(section).__name__
    options = p2pd_options(s, topics=["t"])  # built from the sections on the runtime side (node/service/network.py)
    assert (options.peer_cache_limits.max_peers, options.conn_low) == (9, 2)
    budget = IngestBudget.from_config(s.ingest)
    assert (budget.staged_max, budget.max_wait_s) == (77, 0.5)
    pool = GroupPool.from_config(s.pool, s.admission)
    assert pool.max_per_sender == 3 and pool.admission.dedup_rounds == 11
    assert GroupPool.from_config(s.pool).admission is None  # a bare pool (the self-replay silo's)


def test_nested_swarm_keys_load_from_every_input(tmp_path):
    toml = tmp_path / "node.toml"
    toml.write_text("[swarm.peer_cache]\nmax_peers = 9\n[swarm.ingest]\nmode = \"inline\"\n")
    cfg = load_config("tiny", toml, ["swarm.p2pd.conn_high=0"],
                      environ={"SWARM_NODE_SWARM__ADMISSION__YOUNG_SHARE_MAX": "1.0",
                               "SWARM_NODE_SWARM__PEER_CACHE__ENABLED": "false"})
    s = cfg.swarm
    assert (s.peer_cache.max_peers, s.peer_cache.enabled, s.ingest.mode) == (9, False, "inline")
    assert (s.p2pd.conn_high, s.admission.young_share_max) == (0, 1.0)


OLD_KEYS = [("peer_cache_max_peers", "9", "swarm.peer_cache.max_peers"),
            ("conn_low", "2", "swarm.p2pd.conn_low"),
            ("ingest_max_wait_s", "0.5", "swarm.ingest.max_wait_s"),
            ("pool_max_per_sender", "3", "swarm.pool.max_per_sender"),
            ("young_share_max", "1.0", "swarm.admission.young_share_max"),
            ("peer_cache", "false", "swarm.peer_cache.enabled"),  # the old key is now a section's name
            ("ingest", '"inline"', "swarm.ingest.mode")]


@pytest.mark.parametrize("old,value,new", OLD_KEYS)
def test_an_old_flat_swarm_key_names_its_new_key_in_every_input_form(tmp_path, old, value, new):
    message = f"swarm.{old} is now {new}"
    toml = tmp_path / "old.toml"
    toml.write_text(f"[swarm]\n{old} = {value}\n")
    with pytest.raises(ConfigError, match=message):
        load_config("tiny", toml)
    with pytest.raises(ConfigError, match=message):
        load_config("tiny", None, [f"swarm.{old}={value}"])
    env = f"SWARM_NODE_SWARM__{old.upper()}"
    with pytest.raises(ConfigError, match=message) as err:
        load_config("tiny", None, [], environ={env: value})
    assert env in str(err.value) and "SWARM_NODE_" + new.replace(".", "__").upper() in str(err.value)


def test_every_old_flat_swarm_key_is_renamed_to_a_key_that_exists():
    from node.config.schema import _check_path
    from node.config.swarm import RENAMED_KEYS

    assert len(RENAMED_KEYS) == 31
    for old, new in RENAMED_KEYS.items():
        _check_path(new.split("."))  # raises for a key that does not exist
        assert old.rsplit(".", 1)[-1] not in ("name", "listen", "peers", "identity", "external_per_round")


def test_a_saved_config_with_old_flat_keys_migrates():
    """A checkpoint's config.json written before the move (swarm-node eval reads it back)."""
    from node.config.schema import NodeConfig
    from node.config.swarm import migrate_renamed_keys

    saved = load_config("tiny").model_dump(mode="json")
    old = {**saved, "swarm": {k: v for k, v in saved["swarm"].items()
                              if k not in ("peer_cache", "p2pd", "ingest", "pool", "admission")}}
    old["swarm"].update(peer_cache=False, peer_cache_max_peers=9, conn_low=2, ingest="inline", ingest_max_messages=3,
                        pool_max_groups=7, dedup_rounds=5)
    cfg = NodeConfig.model_validate(migrate_renamed_keys(old))
    s = cfg.swarm
    assert (s.peer_cache.enabled, s.peer_cache.max_peers, s.p2pd.conn_low) == (False, 9, 2)
    assert (s.ingest.mode, s.ingest.max_messages, s.pool.max_groups, s.admission.dedup_rounds) == ("inline", 3, 7, 5)
    assert migrate_renamed_keys(saved) == saved  # a new config is left as it is
