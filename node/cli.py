"""`swarm-node`: the command line.

    swarm-node train  [--preset tiny|smollm2] [--config FILE] [--set key=value ...] [--resume]
    swarm-node join   [--peers MULTIADDR ...] [--listen MULTIADDR] [--swarm NAME] [--mix I/J] [...]
    swarm-node relay  [--peers MULTIADDR ...] [--listen MULTIADDR]   (bootstrap + relay, no model)
    swarm-node keygen [--out FILE]      (default ~/.config/swarm-node/identity.key)
    swarm-node status [--run-dir DIR | --control HOST:PORT]
    swarm-node report RUN_DIR
    swarm-node config [--preset ...] [--set ...] [--explain | --env]
    swarm-node eval   RUN_DIR [--tasks N] [--k K]
    swarm-node testnet [--nodes N] [--rounds R] [--compare 8/0,4/4] [--seeds K] [--hostile K:KIND] [...]

Each command imports what it needs inside its function (the reason beside each), so `--help`, `status`
and `config` never pay for torch, transformers or a transport.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from rich.console import Console

from node.observe.logs import configure as configure_logs, json_lines, say
from node.service.console import allow_reexec, console, pin_hash_seed_if_needed

def resolve_preset(args: argparse.Namespace) -> str:
    """--preset, else $SWARM_NODE_PRESET (a service's environment file picks it), else tiny."""
    from node.config.schema import ConfigError  # the schema (pydantic) loads after parsing: --help never does
    from node.config.presets import PRESETS

    if args.preset:
        return args.preset
    name = os.environ.get("SWARM_NODE_PRESET", "").strip() or "tiny"
    if name not in PRESETS:
        raise ConfigError(f"SWARM_NODE_PRESET={name!r} is not a preset: valid presets are {', '.join(PRESETS)}; "
                          "fix or unset it")
    return name


def _config(args: argparse.Namespace, extra: list[str] = ()):
    from node.config.schema import load_config  # after parsing: --help never loads the schema

    overrides = list(args.set or [])
    if args.rounds is not None:
        overrides.append(f"run.rounds={args.rounds}")
    if args.seed is not None:
        overrides.append(f"run.seed={args.seed}")
    # the environment sits between the config file and --set
    # (docs/configuration.md: "Configuration is typed ... later wins")
    cfg = load_config(resolve_preset(args), args.config, [*overrides, *extra], environ=os.environ)
    configure_logs(cfg.run.log_level, cfg.run.log_format)
    return cfg


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


def cmd_train(args: argparse.Namespace) -> int:
    cfg = _config(args)
    pin_hash_seed_if_needed(cfg)

    from node.config.schema import ConfigError
    from node.service.join import solo_node  # heavy imports (torch, transformers) only once the config is valid
    from node.observe.metrics import RoundTable
    from node.observe.state import NodeObserver, loop_progress
    from node.observe.web import announce, serve_node
    from node.service.shutdown import StopOnSignals

    run_dir = Path(args.run_dir)
    if not args.resume and (run_dir / "checkpoints").exists():
        raise ConfigError(f"{run_dir} already holds checkpoints: pass --resume to continue that run, "
                          "or choose another --run-dir.")
    node = solo_node(cfg, run_dir)
    if args.resume:
        node.resume()  # logs where it resumed (event "resume")
    say(console, f"training {cfg.model.name} on {cfg.tasks.source}:{','.join(cfg.tasks.datasets)} "
                 f"with {cfg.loss.name} for {cfg.run.rounds} rounds -> {run_dir}", "start", command="train",
        model=cfg.model.name, loss=cfg.loss.name, rounds=cfg.run.rounds, run_dir=str(run_dir),
        next_round=node.next_round)
    say(console, f"rollouts: {node.backend_line}", "backend")
    title = f"swarm-node train ({cfg.model.name})"
    table = RoundTable(title, console=console, quiet=args.quiet, log_rounds=json_lines())
    observe = serve_node(cfg.swarm.metrics_listen, NodeObserver(run_dir, title, {}, loop_progress(node)))
    announce(observe, console, "metrics (/metrics) and live page")
    try:
        with StopOnSignals() as stop:  # Ctrl-C / SIGTERM: finish the round and checkpoint it
            node.run(cfg.run.rounds, table, stop)
    finally:
        if observe is not None:
            observe.stop()
        node.close()
    from node.observe.report import summarize, summary_text  # the end-of-run summary's alone
    from node.observe.metrics import read_metrics

    summary = summarize(read_metrics(run_dir))
    say(console, summary_text(summary).rstrip(), "summary", **summary)
    return 0


def _network_overrides(args: argparse.Namespace) -> list[str]:
    """--peers, --listen, --swarm and --identity of `join` and `relay` as config overrides."""
    extra = []
    if args.peers:
        extra.append(f"swarm.peers={_toml_list(args.peers)}")
    if args.listen:
        extra.append(f"swarm.listen={_toml_list(args.listen)}")
    if getattr(args, "swarm", None):  # relay has no gossip topic, so no --swarm
        extra.append(f"swarm.name={args.swarm}")
    if args.identity:
        extra.append(f"swarm.identity={args.identity}")
    return extra


def cmd_join(args: argparse.Namespace) -> int:
    from node.config.schema import ConfigError  # after parsing: --help never loads the schema

    extra = _network_overrides(args)
    if args.mix:
        local, sep, external = args.mix.partition("/")
        if not (sep and local.isdigit() and external.isdigit() and int(local) > 0):
            raise ConfigError(f"--mix expects I/J with I >= 1 local and J >= 0 external groups (e.g. 4/4), got {args.mix!r}")
        extra += [f"tasks.prompts_per_round={local}", f"swarm.external_per_round={external}"]
    cfg = _config(args, extra)
    pin_hash_seed_if_needed(cfg)
    from node.service.join import join  # torch, transformers, a transport: once the config is valid

    return join(cfg, Path(args.run_dir), console, quiet=args.quiet)


def cmd_relay(args: argparse.Namespace) -> int:
    cfg = _config(args, _network_overrides(args))
    from node.service.relay import relay  # a transport: once the config is valid

    return relay(cfg, Path(args.run_dir), console, quiet=args.quiet)


def default_key_path() -> Path:
    """Under the user's config dir, never the working directory (one `git add -A` from published)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "swarm-node" / "identity.key"


def cmd_keygen(args: argparse.Namespace) -> int:
    from protocol import NodeIdentity  # cryptography and the wire protocol: keygen's, not every command's

    path = Path(args.out) if args.out else default_key_path()
    if path.exists() and not args.force:
        console.print(f"[red]{path} already exists[/]: it is a node identity; pass --force to replace it "
                      "(peers will see a new node).")
        return 2
    identity = NodeIdentity.generate()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    identity.save(path, overwrite=args.force)
    console.print(f"wrote {path} (mode 0600)")
    print(identity.peer_id())
    return 0


CHECKED_BY_PEER = "checked_by_peer/"  # the ingest's per-peer counts in StatusReply.ingest
DAEMON_STATES = {0: "starting", 1: "running", 2: "restarting", 3: "closed"}  # protocol/transports/p2pd/shared.py codes


def transport_summary(name: str, counters: dict[str, int]) -> str:
    """One line: the transport, and for p2pd the daemon's state, mesh (topic) peers and DHT/connected peers."""
    if "daemon_state" not in counters:
        return f"transport {name or 'unknown'}"
    topics = ", ".join(f"{k.split(':', 1)[1]}={v}" for k, v in sorted(counters.items()) if k.startswith("topic_peers:"))
    return (f"transport {name or 'p2pd'}: daemon {DAEMON_STATES.get(counters['daemon_state'], '?')} "
            f"(pid {counters.get('daemon_pid', 0)}, restarts {counters.get('daemon_restarts', 0)}); "
            f"connected peers {counters.get('connected_peers', 0)}, DHT peers {counters.get('dht_peers', 0)}; "
            f"topic peers: {topics or 'none yet'}")


def cmd_status(args: argparse.Namespace) -> int:
    from rich.table import Table  # status's table and its gRPC client: no other command's

    from node.observe.control import control_address, fetch_status
    from node.service.reach import reach_summary

    address = args.control or control_address(Path(args.run_dir))
    s = fetch_status(address, timeout_s=args.timeout)
    if args.json:  # for scripts: every field, protobuf's JSON mapping (64-bit counters as strings)
        from google.protobuf.json_format import MessageToJson

        print(MessageToJson(s, preserving_proto_field_name=True))
        return 0
    out = Console() if sys.stdout.isatty() else Console(width=200)  # full peer ids when piped
    out.print(f"peer {s.peer_id}  swarm {s.swarm!r}  round {s.round}  policy v{s.policy_version}  "
              f"up {s.uptime_s} s  peers connected {len(s.connected_peers)}", highlight=False)
    for addr in s.listen_addrs:
        out.print(f"  listening on {addr}", highlight=False)
    out.print(transport_summary(s.transport, dict(s.transport_counters)), highlight=False)
    if (reach := reach_summary(dict(s.transport_counters))) is not None:
        out.print(reach, highlight=False)
    out.print("transport: " + ", ".join(f"{k}={v}" for k, v in sorted(s.transport_counters.items())), highlight=False)
    out.print(f"messages accepted {s.accepted}; rejected: "
              + (", ".join(f"{k}={v}" for k, v in sorted(s.rejected_by_reason.items())) or "none"), highlight=False)
    out.print("external rollouts trained by behavior tier: "
              + (", ".join(f"tier {k}={v}" for k, v in sorted(s.tier_rollouts.items())) or "none yet")
              + "  (0 exact, 1 aligned, 2 proxy)", highlight=False)
    out.print("observed: " + (", ".join(f"{k}={v}" for k, v in sorted(s.observed.items())) or "nothing"),
              highlight=False)
    counts = {k: v for k, v in sorted(s.ingest.items()) if not k.startswith(CHECKED_BY_PEER)}
    out.print("ingest: " + (", ".join(f"{k}={v}" for k, v in counts.items()) or "inline"), highlight=False)
    out.print(f"admission: {s.established_keys} keys established, {s.young_keys} young", highlight=False)
    out.print("hints: " + (", ".join(f"{k}={v}" for k, v in sorted(s.hint_counters.items())) or "none"),
              highlight=False)
    peers = Table(title="peers")
    for col in ("peer", "connected", "score", "banned", "ban left s", "accepted", "rejected", "checked",
                "established"):
        peers.add_column(col)
    for p in s.peers:
        promoted = s.established.get(p.peer_id)
        peers.add_row(p.peer_id, str(p.connected), f"{p.score:+.2f}", str(p.banned), f"{p.ban_remaining_s:.0f}",
                      str(p.accepted), str(p.rejected), str(s.ingest.get(CHECKED_BY_PEER + p.peer_id, 0)),
                      "no" if promoted is None else "yes")
    out.print(peers)
    out.print(exchange_summary(dict(s.exchange_totals)), highlight=False)
    rounds = Table(title="recent rounds")
    for col in ("round", "local", "ext received", "ext verified", "ext used", "ext dropped", "tier 0/1/2",
                "exchange s"):
        rounds.add_column(col, justify="right")
    for r in s.rounds:
        rounds.add_row(*(str(v) for v in (r.round, r.local_groups, r.external_groups_received, r.groups_verified,
                                          r.external_groups_used, r.external_groups_dropped)),
                       f"{r.tier0_rollouts}/{r.tier1_rollouts}/{r.tier2_rollouts}", f"{r.exchange_s:.3f}")
    out.print(rounds)
    return 0


def exchange_summary(totals: dict[str, float]) -> str:
    """One line: what the exchange verified for what it used, and where its seconds went."""
    if not totals:
        return "exchange: nothing yet"
    used, verified = totals.get("external_used", 0), totals.get("groups_verified", 0)
    phases = {k.removeprefix("t_exchange_"): v for k, v in totals.items() if k.startswith("t_exchange_")}
    ratio = f"{verified / used:.2f}" if used else "-"
    return (f"exchange: {totals.get('external_received', 0):.0f} groups received, {verified:.0f} verified "
            f"({totals.get('groups_audited', 0):.0f} audits), {used:.0f} used: {ratio} verified per used; seconds "
            + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))


def cmd_config(args: argparse.Namespace) -> int:
    """The resolved configuration, one `section.key = value` line per knob (TOML values);
    --explain adds what each knob does."""
    from node.config.schema import explain  # after parsing: --help never loads the schema

    cfg = _config(args)
    if args.env:
        from node.config.schema import load_config  # --env's writer, no other command's
        from node.config.env_file import render_env_file

        preset = resolve_preset(args)
        print(render_env_file(cfg, load_config(preset), preset), end="")
        return 0
    for key, value, description in explain(cfg):
        shown = json.dumps(value, default=str) if not isinstance(value, str) else json.dumps(value)
        line = f"{key} = {shown}"
        print(f"{line:<48} # {description}" if args.explain and description else line)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from node.observe.report import write_report  # matplotlib: the report's alone

    png, txt, text = write_report(Path(args.run_dir))
    console.print(text, highlight=False)
    console.print(f"wrote {png} and {txt}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Held-out pass@1 / pass@k of a run's latest checkpoint (node/train/eval.py): a table on stdout and
    RUN_DIR/eval-round-NNNNNN.json."""
    from pydantic import ValidationError  # the schema and checkpoints: eval's, after parsing
    from rich.table import Table

    from node.config.schema import ConfigError, NodeConfig
    from node.config.swarm import migrate_renamed_keys
    from policy.checkpoint import latest_checkpoint_path

    run_dir = Path(args.run_dir)
    checkpoint = latest_checkpoint_path(run_dir)
    config_file = checkpoint / "config.json" if checkpoint is not None else None
    if config_file is None or not config_file.is_file():
        raise FileNotFoundError(f"no checkpoint in {run_dir}/checkpoints: is this a run directory? "
                                "(`swarm-node train --run-dir DIR` writes checkpoints)")
    data = migrate_renamed_keys(json.loads(config_file.read_text()))  # a run saved before swarm's sections
    data.setdefault("eval", {})
    if args.tasks is not None:
        data["eval"]["tasks_per_family"] = args.tasks
    if args.k is not None:
        data["eval"]["k"] = args.k
    try:
        cfg = NodeConfig.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"invalid configuration in {config_file} (with --tasks/--k): {problems}") from None
    pin_hash_seed_if_needed(cfg)

    from node.service.join import solo_node  # torch and transformers: once the run's config is read

    node = solo_node(cfg, run_dir)
    round_index = node.resume(truncate_metrics=False)  # reading the run, not continuing it
    if round_index is None:  # the checkpoint went away since we read its config
        raise FileNotFoundError(f"no checkpoint in {run_dir}/checkpoints any more")
    result = node.evaluate()
    evaluation = {"round": round_index, "policy_version": node.learner.policy_version,
                  "checkpoint": config_file.parent.name, "tasks_per_family": cfg.eval.tasks_per_family,
                  "heldout_seed": node.evaluator.seed, "sampling_seed": node.evaluator.sampling_seed,
                  "temperature": cfg.sampling.temperature, "ood": cfg.eval.ood, **result}
    out_path = run_dir / f"eval-round-{round_index:06d}.json"
    out_path.write_text(json.dumps(evaluation, indent=2, default=str) + "\n")

    k = result["heldout_k"]
    table = Table(title=f"held-out evaluation of {run_dir} "
                        f"(round {round_index}, policy v{evaluation['policy_version']})")
    for col in ("family", "pass@1", f"pass@{k}", "tasks"):
        table.add_column(col, justify="left" if col == "family" else "right")
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    for family, v in result["heldout_by_family"].items():
        table.add_row(family, fmt(v["pass1"]), fmt(v["passk"]), str(v["tasks"]))
    inside = sum(v["tasks"] for f, v in result["heldout_by_family"].items() if not f.startswith("ood:"))
    table.add_row("all (in-distribution)", fmt(result["heldout_pass1"]), fmt(result["heldout_passk"]), str(inside),
                  style="bold")
    Console().print(table)
    console.print(f"pass@1 greedy; pass@{k}: {k} samples at temperature {cfg.sampling.temperature} (fixed seed); "
                  f"{result['t_eval']:.1f} s -> wrote {out_path}", highlight=False)
    return 0


def add_config_options(p: argparse.ArgumentParser, run_dir: str, presets: list[str]) -> None:
    """The options of the commands that build a node's configuration (train, join, config)."""
    p.add_argument("--preset", choices=presets, help="default: $SWARM_NODE_PRESET, else tiny")
    p.add_argument("--config", help="TOML file with overrides of the preset")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one key, e.g. optim.lr=3e-4")
    p.add_argument("--rounds", type=int, help="total rounds (shorthand for --set run.rounds=N)")
    p.add_argument("--seed", type=int, help="run seed (shorthand for --set run.seed=N)")
    p.add_argument("--run-dir", default=run_dir, help="where metrics and checkpoints go")
    p.add_argument("--quiet", action="store_true", help="no per-round output")


def add_network_parsers(sub, presets: list[str]) -> None:
    """`join` (train and share) and `relay` (bootstrap peer and circuit relay, no model)."""
    join = sub.add_parser("join", help="join a swarm: train and share verified rollouts over libp2p")
    add_config_options(join, "runs/node", presets)
    join.add_argument("--peers", nargs="*", metavar="MULTIADDR", help="bootstrap peers (/ip4/.../tcp/.../p2p/<id>)")
    join.add_argument("--listen", action="append", metavar="MULTIADDR", help="listen address (default /ip4/0.0.0.0/tcp/0: a free port, printed at start)")
    join.add_argument("--swarm", help="swarm name (gossip topic namespace)")
    join.add_argument("--identity", help="node key file (default <run-dir>/identity.key, created if missing)")
    join.add_argument("--mix", metavar="I/J", help="SAPO mix: I local + J external groups per update, e.g. 4/4")
    join.set_defaults(func=cmd_join)

    relay = sub.add_parser("relay", help="run a bootstrap peer and circuit relay for nodes behind NAT (no model)")
    add_config_options(relay, "runs/relay", presets)
    relay.add_argument("--peers", nargs="*", metavar="MULTIADDR", help="other bootstrap peers or relays to dial")
    relay.add_argument("--listen", action="append", metavar="MULTIADDR",
                       help="listen address; pin a port others can reach, e.g. /ip4/0.0.0.0/tcp/4001")
    relay.add_argument("--identity", help="node key file (default <run-dir>/identity.key, created if missing)")
    relay.set_defaults(func=cmd_relay)


def build_parser() -> argparse.ArgumentParser:
    from node.config.presets import PRESETS  # names only: the config's schema loads after parsing

    parser = argparse.ArgumentParser(prog="swarm-node", description="Decentralized RL post-training node.")
    sub = parser.add_subparsers(dest="command", required=True)
    presets = list(PRESETS)

    train = sub.add_parser("train", help="train one node locally (no network)")
    add_config_options(train, "runs/latest", presets)
    train.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --run-dir")
    train.set_defaults(func=cmd_train)

    add_network_parsers(sub, presets)

    keygen = sub.add_parser("keygen", help="write a node identity (Ed25519, mode 0600) and print its peer id")
    keygen.add_argument("--out", help="key file (default $XDG_CONFIG_HOME/swarm-node/identity.key, "
                        "i.e. ~/.config/swarm-node/identity.key)")
    keygen.add_argument("--force", action="store_true", help="replace an existing key file")
    keygen.set_defaults(func=cmd_keygen)

    status = sub.add_parser("status", help="ask a running node for peers, counters, scores and rounds")
    status.add_argument("--run-dir", default="runs/node", help="the node's run dir (reads node.json)")
    status.add_argument("--control", metavar="HOST:PORT", help="control service address instead of --run-dir")
    status.add_argument("--timeout", type=float, default=5.0)
    status.add_argument("--json", action="store_true", help="print the whole status as JSON (for scripts)")
    status.set_defaults(func=cmd_status)

    config = sub.add_parser("config", help="print the resolved configuration (--explain: what each knob does)")
    add_config_options(config, "runs/latest", presets)
    config.add_argument("--explain", action="store_true", help="describe every knob next to its value")
    config.add_argument("--env", action="store_true", help="print an environment file (systemd EnvironmentFile=, "
                        "docker --env-file): every key as SWARM_NODE_<SECTION>__<KEY>, commented out at the "
                        "preset's value unless set otherwise, with what it does")
    config.set_defaults(func=cmd_config)

    report = sub.add_parser("report", help="plot a run's metrics (PNG) and print a summary")
    report.add_argument("run_dir")
    report.set_defaults(func=cmd_report)

    evaluate = sub.add_parser("eval", help="held-out pass@1 / pass@k of a run's latest checkpoint")
    evaluate.add_argument("run_dir")
    evaluate.add_argument("--tasks", type=int,
                          help="held-out tasks per family (default: the run's eval.tasks_per_family)")
    evaluate.add_argument("--k", type=int, help="samples per task for pass@k (default: the run's eval.k)")
    evaluate.set_defaults(func=cmd_eval)

    # subcommands defined in their rooms, which import the schema (pydantic) and peers/: loaded when
    # the parser is built, not by every `import node.cli`
    from node.service.peers_command import add_peers_parser
    from node.testnet.command import add_testnet_parser

    add_peers_parser(sub)
    add_testnet_parser(sub, presets)
    return parser


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors whose message already says what is wrong and what to do: no traceback for these."""
    from node.config.schema import ConfigError
    from node.tasks.base import UnknownDatasetError, UnknownTaskError
    from policy.settings import ModelNotFoundError  # not policy.models: a config error needs no torch

    from protocol import IdentityError

    return (ConfigError, FileNotFoundError, ModelNotFoundError, UnknownDatasetError, UnknownTaskError,
            IdentityError, ConnectionError)


def _report(err: Exception) -> int:
    if json_lines():
        logging.getLogger("node.cli").error(str(err), extra={"event": "error", "error": type(err).__name__})
    else:
        console.print(f"[red]error:[/] {err}", soft_wrap=True, highlight=False)
    return 2


def main(argv: list[str] | None = None) -> int:
    allow_reexec(argv is None)
    args = build_parser().parse_args(argv)
    configure_logs()  # defaults until a command has its config (run.log_level, run.log_format)
    try:
        return args.func(args)
    except (FileNotFoundError, ConnectionError) as err:  # first: a failing `status` (health check) skips torch
        return _report(err)
    except _user_errors() as err:
        return _report(err)
    except KeyboardInterrupt:  # a second stop signal (node/service/shutdown.py), or Ctrl-C while starting
        console.print("[red]stopped at once[/]: rounds since the last checkpoint are lost")
        return 130


if __name__ == "__main__":
    sys.exit(main())
