"""node/peers/hint_requests.py's bounds: requests are unauthenticated and origins free, so when the
queue is full an honest peer's request is kept over a flood of fresh origins."""
from node.peers.hint_requests import FULL, HintRequestQueue
from node.tasks.base import TaskRef
from protocol import Received


def request(origin: str, index: int, at: float = 0.0) -> tuple[Received, TaskRef]:
    ref = TaskRef(source="synthetic", dataset="add", config_digest="0123456789abcdef", seed=0, index=index)
    return Received(origin, b"", at), ref


def waiting_origins(queue: HintRequestQueue) -> set[str]:
    return {waiting.item.from_peer for _, waiting in queue.waiting(0.0)}


def test_fresh_origins_do_not_push_out_a_waiting_request_and_established_ones_displace_others_first():
    queue = HintRequestQueue(capacity=64, established=lambda peer: peer.startswith("established"))
    queue.add(*request("honest", 0))
    for i in range(64):  # one request each from 64 fresh origins: each tie drops the newest origin
        queue.add(*request(f"fresh-{i}", 1 + i))
    assert "honest" in waiting_origins(queue) and len(queue) == 64
    assert queue.dropped[FULL] == 1
    for i in range(8):  # established origins displace the others, newest first
        queue.add(*request(f"established-{i}", 100 + i))
    origins = waiting_origins(queue)
    assert {f"established-{i}" for i in range(8)} <= origins and "honest" in origins
    assert not {f"fresh-{i}" for i in range(55, 63)} & origins  # the 8 newest fresh origins went
    for i in range(60):  # a full queue of established requests: only established ones are left to drop
        queue.add(*request(f"established-x{i}", 200 + i))
    assert len(queue) == 64 and all(origin.startswith("established") for origin in waiting_origins(queue))
