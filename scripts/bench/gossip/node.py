"""One node of scripts/bench/gossip/bench.py: a protocol-only node (no model) in its own process.

    .venv/bin/python -m scripts.bench.gossip.node CONFIG.json     (started by scripts.bench.gossip.swarm)

It builds the transport named in CONFIG (``libp2p``: protocol/transports/libp2p/; ``p2pd``: the
go-libp2p daemon transport with its default connection bounds; ``p2pd-unbounded``: the same with
``conn_high=0``), verifies every message with a real Ingress, and talks to the
coordinator over stdin/stdout JSON lines (libraries' logs go to stderr, a per-node log file).
It exits at a hard deadline, when stdin closes (coordinator gone) or on ``quit``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from scripts.common import invocation

SWARM = "bench"
ROLLOUT_KIND = "rollouts"
FLOOD_KIND = "flood"
N_TEMPLATES = 8  # distinct group contents; every seal gets a new sequence -> distinct bytes
GROUP_COMPLETIONS, TOKENS_PER_COMPLETION = 8, 64  # latency phases: a realistic group (~7.5 KB)
FLOOD_COMPLETIONS = 4  # flood phase: ~4 KB envelopes
TRANSPORTS = ("p2pd", "p2pd-unbounded", "libp2p")  # p2pd: bounded connections (the default)


def build_group(seed: int, index: int, completions: int = GROUP_COMPLETIONS):
    """A RolloutGroup shaped like node/peers/exchange.py's to_wire(): completions x 64 tokens, token ids,
    behavior log-probs, char offsets, claimed rewards, task ref, model card, sampling, question
    and answer."""
    from proto import swarm_pb2
    from protocol.testing import make_completion

    return swarm_pb2.RolloutGroup(
        task_ref=swarm_pb2.TaskRef(source="reasoning_gym", dataset="basic_arithmetic",
                                   config_digest="3f9a1c0e5b7d2468", seed=1234, index=index),
        model=swarm_pb2.ModelCard(name="HuggingFaceTB/SmolLM2-135M-Instruct",
                                  tokenizer_fingerprint="a41c9e07d3b25f68",
                                  weights_version="9d0e5c1b27a4f836"),
        sampling=swarm_pb2.SamplingParams(temperature=1.0, max_new_tokens=TOKENS_PER_COMPLETION, top_p=1.0),
        completions=[make_completion(TOKENS_PER_COMPLETION, seed=seed * 1000 + i) for i in range(completions)],
        policy_version=17,
        round=42,
        question=f"Calculate {index % 97} + {(index * 7) % 89}. Give only the final number.",
        answer=str(index % 97 + (index * 7) % 89),
    )


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:20]


def topics() -> tuple[str, str]:
    from protocol import topic_name

    return topic_name(SWARM, ROLLOUT_KIND), topic_name(SWARM, FLOOD_KIND)


def available_transports() -> list[str]:
    """The variants this machine can run: the p2pd ones need the daemon from the hivemind wheel."""
    from protocol.transports.p2pd.daemon import DaemonStartError, daemon_binary

    try:
        daemon_binary()
    except DaemonStartError:
        return [t for t in TRANSPORTS if not t.startswith("p2pd")]
    return list(TRANSPORTS)


def make_transport(name: str, seed: bytes, listen: str, bootstrap: list[str], topic_names: list[str]) -> Any:
    """The transport factory: every variant the benchmark compares, with the same addresses."""
    if name == "libp2p":
        from protocol.transports.libp2p import Libp2pOptions, Libp2pTransport

        return Libp2pTransport(seed, Libp2pOptions(listen=[listen], bootstrap=bootstrap, topics=topic_names,
                                                   dial_timeout=5.0, backoff_initial=0.25, backoff_max=2.0,
                                                   start_timeout=30.0, close_timeout=5.0))
    if name in ("p2pd", "p2pd-unbounded"):
        from protocol.transports.options import P2pdOptions
        from protocol.transports.p2pd import P2pdTransport

        # flood_cut_rate=0: the flood phase measures ingest throughput, which the p2pd flood guard
        # (it cuts an origin over 80 msgs/s) would stop after its burst. p2pd: the default
        # connection bounds; p2pd-unbounded: conn_high=0, connected to every peer it meets.
        bounds = {} if name == "p2pd" else {"conn_high": 0}
        return P2pdTransport(seed, P2pdOptions(listen=[listen], bootstrap=bootstrap, topics=topic_names,
                                               start_timeout_s=30.0, flood_cut_rate=0, **bounds))
    raise ValueError(f"unknown transport {name!r}: choose from {', '.join(TRANSPORTS)}")


def dial(transport: Any, addr: str) -> str | None:
    """Connects a p2pd node to `addr` through its daemon's control socket (P2pdTransport.daemon: the
    transport has no public dial; the flood phase needs its senders next to the target, since
    GossipSub routes a topic only through its subscribers). None if done, else why not."""
    daemon = getattr(transport, "daemon", None)
    if daemon is None:
        return "not a running p2pd transport"
    from protocol.transports.p2pd.addrs import peer_id_bytes, split_peer_addr
    from protocol.transports.p2pd.control import ControlConnection, ControlError, connect_request

    peer, raw = split_peer_addr(addr)
    try:
        with ControlConnection(daemon.socket_path, 5.0) as conn:
            conn.request(connect_request(peer_id_bytes(peer), [raw], timeout_s=4))
    except ControlError as err:
        return str(err)
    return None


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as fh:
                    kids = [int(x) for x in fh.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime + stime
    except (OSError, IndexError, ValueError):
        return 0.0


def _proc_rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def rss_mb_with_children() -> float:
    """Resident memory of this process and its live descendants (the p2pd daemon), MiB."""
    return sum(_proc_rss_mb(p) for p in [os.getpid(), *_descendants(os.getpid())])


def cpu_s_with_children() -> float:
    """This process's CPU seconds plus its live descendants' (the p2pd daemon is a child)."""
    return time.process_time() + sum(_proc_cpu_s(p) for p in _descendants(os.getpid()))


def gossip_view(transport: Any, topic_names: list[str]) -> tuple[dict[str, int] | None, dict[str, int]]:
    """(GossipSub mesh size per topic, live connections per negotiated muxer) from the transport's
    public read-only views: py-libp2p's facade has both (Libp2pTransport.mesh_peers and
    connection_muxers); the p2pd daemon exposes no mesh, so (None, {}) there and the mesh-ready wait
    falls back on connected peers."""
    mesh_peers = getattr(transport, "mesh_peers", None)
    if mesh_peers is None:
        return None, {}
    return {t: len(mesh_peers(t)) for t in topic_names}, transport.connection_muxers()


class ControlChannel:
    """JSON lines to the coordinator on the real stdout; anything a library prints goes to stderr
    (the node's log file)."""

    def __init__(self) -> None:
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        self.lock = threading.Lock()

    def emit(self, **event: Any) -> None:
        line = json.dumps(event, separators=(",", ":"))
        with self.lock:
            try:
                self.out.write(line + "\n")
                self.out.flush()
            except (BrokenPipeError, ValueError):
                os._exit(4)  # coordinator gone


def start_watchdog(deadline: float) -> None:
    """Hard deadline: the node never outlives the benchmark."""
    def watchdog() -> None:
        time.sleep(max(1.0, deadline - time.time()))
        sys.stderr.write("bench_gossip node: hard deadline reached, exiting\n")
        sys.stderr.flush()
        os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()


class FloodCounters:
    """What the flood phase received and verified, guarded by one lock (drain thread vs commands)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, Any] = {}
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.values = dict(ok=0, bad=0, rx=0, first_rx=None, last_rx=None, first_done=None, last_done=None,
                               busy_s=0.0, max_backlog=0, batches=0)

    def received(self, items: list) -> None:
        first, last = min(it.received_at for it in items), max(it.received_at for it in items)
        with self.lock:
            v = self.values
            v["max_backlog"] = max(v["max_backlog"], len(items))
            v["batches"] += 1
            v["rx"] += len(items)
            v["first_rx"] = min(v["first_rx"] or first, first)
            v["last_rx"] = max(v["last_rx"] or last, last)

    def verified(self, ok: bool, seconds: float) -> None:
        now = time.time()
        with self.lock:
            v = self.values
            v["busy_s"] += seconds
            v["ok" if ok else "bad"] += 1
            v["first_done"] = v["first_done"] or now
            v["last_done"] = now

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return dict(self.values)


class BenchNode:
    """The transport, its verifying ingresses and the coordinator's commands (one method each)."""

    def __init__(self, cfg: dict, transport: Any, identity: Any, control: ControlChannel) -> None:
        from protocol import Ingress, Outbox, RateLimits

        self.cfg, self.transport, self.emit = cfg, transport, control.emit
        self.roll_topic, self.flood_topic = topics()
        self.my_topics = [self.roll_topic] + ([self.flood_topic] if cfg["flood_target"] else [])
        self.outbox = Outbox(identity)
        base = cfg["index"] * 100
        self.templates = [build_group(base + k, base + k) for k in range(N_TEMPLATES)]
        self.flood_templates = [build_group(base + k, base + k, FLOOD_COMPLETIONS) for k in range(N_TEMPLATES)]
        self.ingress = Ingress()  # production defaults (rate limits included) for the latency phases
        lifted = RateLimits(messages_per_s=1e9, message_burst=1e9, bytes_per_s=1e12, byte_burst=1e12)
        self.flood_ingress = Ingress(rate_limits=lifted)  # as protocol/bench.py: the cost, not the policy
        self.flood = FloodCounters()
        self.flood_sealed: list[bytes] = []
        self.stop = threading.Event()

    def drain_loop(self) -> None:
        poll = self.cfg["poll_ms"] / 1000.0
        while not self.stop.is_set():
            got = 0
            for item in self.transport.drain(self.roll_topic):
                got += 1
                if self.ingress.accept_received(item) is not None:
                    self.emit(ev="rx", d=digest(item.data), t=time.time(), tr=item.received_at)
            if self.cfg["flood_target"]:
                items = self.transport.drain(self.flood_topic)
                if items:
                    got += len(items)
                    self.flood.received(items)
                    for item in items:
                        t0 = time.perf_counter()
                        ok = self.flood_ingress.accept_received(item) is not None
                        self.flood.verified(ok, time.perf_counter() - t0)
            if not got:
                self.stop.wait(poll)

    def status(self) -> dict[str, Any]:
        mesh, muxers = gossip_view(self.transport, self.my_topics)
        return dict(peers=len(self.transport.peers()), mesh=mesh, stats=self.transport.stats(),
                    cpu=cpu_s_with_children(), muxers=muxers, rss_mb=rss_mb_with_children())

    def publish_job(self, topic: str, n: int, spacing: float, tag: str) -> None:
        sealed = [self.outbox.seal(self.templates[k % N_TEMPLATES]) for k in range(n)]
        records = []
        for k, data in enumerate(sealed):
            t = time.time()
            self.transport.publish(topic, data)
            records.append([digest(data), t])
            if spacing and k + 1 < n:
                time.sleep(spacing)
        self.emit(ev="published", tag=tag, items=records, size=len(sealed[0]) if sealed else 0)

    def flood_job(self) -> None:
        stats = self.transport.stats
        base_published = stats().get("published", 0)
        t0 = time.time()
        for data in self.flood_sealed:
            self.transport.publish(self.flood_topic, data)
        t_queued = time.time()
        deadline = time.monotonic() + 60.0
        while stats().get("published", 0) < base_published + len(self.flood_sealed) and time.monotonic() < deadline:
            time.sleep(0.005)
        self.emit(ev="flood_sent", n=len(self.flood_sealed), t0=t0, t_queued=t_queued, t_pumped=time.time(),
                  pumped=stats().get("published", 0) - base_published)

    # the coordinator's commands; "quit" and EOF end the loop in serve()
    def cmd_status(self, cmd: dict) -> None:
        self.emit(ev="status", **self.status())

    def cmd_publish(self, cmd: dict) -> None:
        topic = self.flood_topic if cmd.get("topic") == FLOOD_KIND else self.roll_topic
        args = (topic, int(cmd["n"]), float(cmd.get("spacing", 0)), cmd.get("tag", ""))
        threading.Thread(target=self.publish_job, daemon=True, args=args).start()

    def cmd_flood_prepare(self, cmd: dict) -> None:
        self.flood_sealed = [self.outbox.seal(self.flood_templates[k % N_TEMPLATES]) for k in range(int(cmd["n"]))]
        size = len(self.flood_sealed[0]) if self.flood_sealed else 0
        self.emit(ev="flood_ready", n=len(self.flood_sealed), size=size)

    def cmd_flood_go(self, cmd: dict) -> None:
        threading.Thread(target=self.flood_job, daemon=True).start()

    def cmd_flood_reset(self, cmd: dict) -> None:
        self.flood.reset()
        self.emit(ev="flood_reset")

    def cmd_flood_report(self, cmd: dict) -> None:
        self.emit(ev="flood_report", **self.flood.snapshot(),
                  rejected=dict(self.flood_ingress.snapshot().rejected_by_reason))

    def cmd_report(self, cmd: dict) -> None:
        snap = self.ingress.snapshot()
        self.emit(ev="report", accepted=snap.accepted, rejected=dict(snap.rejected_by_reason), **self.status())

    def cmd_dial(self, cmd: dict) -> None:
        self.emit(ev="dialed", error=dial(self.transport, cmd["addr"]))

    def serve(self) -> int:
        """Run commands from stdin until quit or EOF (coordinator gone); close the transport."""
        code = 0
        try:
            for line in sys.stdin:
                cmd = json.loads(line)
                if cmd["cmd"] == "quit":
                    break
                handler = getattr(self, f"cmd_{cmd['cmd']}", None)
                if handler is not None:
                    handler(cmd)
        except Exception as e:  # noqa: BLE001
            sys.stderr.write(f"node command loop failed: {type(e).__name__}: {e}\n")
            code = 5
        finally:
            self.stop.set()
            t0 = time.time()
            self.transport.close()
            self.emit(ev="bye", close_s=time.time() - t0)  # exits the process if the coordinator is gone
        return code


def main(cfg_path: str) -> int:
    t_proc = time.time()
    cfg = json.loads(Path(cfg_path).read_text())
    control = ControlChannel()
    start_watchdog(cfg["deadline"])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s node{cfg['index']} %(name)s %(levelname)s %(message)s")

    from protocol import NodeIdentity

    t_imported = time.time()
    identity = NodeIdentity.from_seed(bytes.fromhex(cfg["seed"]))
    roll_topic, flood_topic = topics()
    try:
        transport = make_transport(cfg["transport"], identity.private_seed(), cfg["listen"], cfg["bootstrap"],
                                   [roll_topic] + ([flood_topic] if cfg["flood_target"] else []))
        transport.start()
    except Exception as e:  # noqa: BLE001 - reported to the coordinator, which names the node and its log
        control.emit(ev="error", error=f"{type(e).__name__}: {e}")
        return 2
    t_listening = time.time()
    node = BenchNode(cfg, transport, identity, control)
    threading.Thread(target=node.drain_loop, daemon=True).start()
    control.emit(ev="ready", peer_id=transport.peer_id, addrs=transport.listen_addrs(), t=time.time(), t_proc=t_proc,
                 import_s=t_imported - t_proc, listen_s=t_listening - t_imported)
    return node.serve()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {invocation(__spec__)} CONFIG.json (started by scripts/bench/gossip/bench.py)")
    sys.exit(main(sys.argv[1]))
