"""The local gRPC control service (NodeControl.Status) and its client, `swarm-node status`.

It binds to 127.0.0.1 by default: it reports peer scores and counters, nothing a remote party
needs. The bound address is written to `<run_dir>/node.json` so `status --run-dir` finds it.
"""
from __future__ import annotations

import dataclasses
import json
from concurrent import futures
from pathlib import Path
from typing import Callable

import grpc

from policy.ground import atomic_write_text
from proto import swarm_pb2, swarm_pb2_grpc

NODE_FILE = "node.json"
RECENT_ROUNDS = 20


class ControlServicer(swarm_pb2_grpc.NodeControlServicer):
    def __init__(self, snapshot: Callable[[], dict]):
        self.snapshot = snapshot

    def Status(self, request, context):  # noqa: N802 (gRPC method name)
        return status_reply(self.snapshot())


def status_reply(s: dict) -> swarm_pb2.StatusReply:
    reply = swarm_pb2.StatusReply(
        peer_id=s["peer_id"], swarm=s["swarm"], listen_addrs=s["listen_addrs"], connected_peers=s["connected"],
        round=s["round"], policy_version=s["policy_version"], uptime_s=int(s["uptime_s"]), accepted=s["accepted"],
        transport=s.get("transport_name", ""))
    reply.rejected_by_reason.update({k: int(v) for k, v in s["rejected_by_reason"].items()})
    reply.transport_counters.update({k: int(v) for k, v in s["transport"].items()})
    reply.tier_rollouts.update({k: int(v) for k, v in s.get("tiers_used", {}).items()})
    reply.hint_counters.update({k: int(v) for k, v in s.get("hints", {}).items()})
    reply.hint_counters.update(flat_counts(s.get("hint_requests", {}), "peer_requests/"))
    reply.exchange_totals.update({k: float(v) for k, v in s.get("exchange_totals", {}).items()})
    reply.observed.update({k: int(v) for k, v in s.get("observed", {}).items()})
    reply.ingest.update(flat_counts(s.get("ingest", {})))
    admission = s.get("admission", {})
    reply.established.update({key: float(at) for key, at in admission.get("established", [])})
    reply.young_keys, reply.established_keys = admission.get("young_count", 0), admission.get("established_count", 0)
    for record in admission.get("keys", []):
        reply.keys.add(**record)
    connected = set(s["connected"])
    for info in s["peers"]:
        reply.peers.add(**dataclasses.asdict(info), connected=info.peer_id in connected)
    for usage in s["rounds"][-RECENT_ROUNDS:][::-1]:
        reply.rounds.add(**usage)
    return reply


def flat_counts(tree: dict, prefix: str = "") -> dict[str, int]:
    """Nested counters as one level, keys joined by "/"; strings (e.g. the ingest mode) left out."""
    flat: dict[str, int] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flat_counts(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)):  # bools too
            flat[f"{prefix}{key}"] = int(value)
    return flat


def start_control_server(address: str, snapshot: Callable[[], dict]) -> tuple[grpc.Server, str]:
    """Serve NodeControl on `address` ('127.0.0.1:0' picks a port); returns (server, bound address)."""
    host, _, port = address.rpartition(":")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="control"))
    swarm_pb2_grpc.add_NodeControlServicer_to_server(ControlServicer(snapshot), server)
    bound = server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot bind the control service to {address}: is the port in use? "
                      "(set swarm.control=127.0.0.1:0 to pick a free one)")
    server.start()
    return server, f"{host}:{bound}"


def write_node_file(run_dir: Path, info: dict) -> None:
    atomic_write_text(Path(run_dir) / NODE_FILE, json.dumps(info, indent=2))


def control_address(run_dir: Path) -> str:
    path = Path(run_dir) / NODE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is a node running with --run-dir {run_dir}? "
                                "(or pass --control HOST:PORT)")
    return json.loads(path.read_text())["control"]


def fetch_status(address: str, timeout_s: float = 5.0) -> swarm_pb2.StatusReply:
    with grpc.insecure_channel(address) as channel:
        stub = swarm_pb2_grpc.NodeControlStub(channel)
        try:
            return stub.Status(swarm_pb2.StatusRequest(), timeout=timeout_s)
        except grpc.RpcError as err:
            raise ConnectionError(f"no node answered at {address} within {timeout_s:.0f} s "
                                  f"({err.code().name}): is it running?") from None
