"""Real `swarm-node join` processes on 127.0.0.1 (tiny preset, the default p2pd transport): exchange,
SIGKILL, rejoin, losing the bootstrap node, rejoining from the peer cache."""
import json
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from node.observe.metrics import read_metrics
from tests.support.processes import repo_env
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow

ARGS = ["join", "--preset", "tiny", "--rounds", "400", "--quiet", "--listen", "/ip4/127.0.0.1/tcp/0",
        "--set", "swarm.min_round_s=0.4", "--set", "run.checkpoint_every=2", "--set", "run.threads=1",
        "--swarm", "test"]


# the tier machinery under test: peers' log-probs used (the default treats every peer sample as tier 2)
WITH_CLAIMS = ["--set", "loss.off_policy.sender_logprobs=true"]


def start(popen, run_dir: Path, peers=(), args=ARGS):
    cmd = [sys.executable, "-m", "node.cli", *args, "--run-dir", str(run_dir)]
    if peers:
        cmd += ["--peers", *peers]
    log = open(run_dir.parent / f"{run_dir.name}.log", "ab")
    return popen(cmd, cwd=ROOT, env=repo_env(), stdout=log, stderr=log)



def node_info(run_dir: Path) -> dict:
    return json.loads((run_dir / "node.json").read_text())


def senders_used(run_dir: Path, since_round: int = -1) -> set[str]:
    return {s for r in read_metrics(run_dir) if r["round"] > since_round
            for s, n in r.get("external_used_by_sender", {}).items() if n > 0}



def test_three_nodes_share_survive_a_kill_and_rejoin(tmp_path, processes):
    a, b, c = (tmp_path / n for n in "abc")
    args = [*ARGS, *WITH_CLAIMS]
    procs = [start(processes, a, args=args)]
    wait_until(lambda: (a / "node.json").exists(), "node A to listen", procs=procs, timeout=90, step=0.25)
    bootstrap = node_info(a)["listen_addrs"]
    procs += [start(processes, b, bootstrap, args=args), start(processes, c, bootstrap, args=args)]
    wait_until(lambda: all((d / "node.json").exists() for d in (b, c)), "B and C to listen",
               procs=procs, timeout=90, step=0.25)
    ids = {d: node_info(d)["peer_id"] for d in (a, b, c)}

    # every node trains on verified groups from both other peers
    for d in (a, b, c):
        others = {ids[o] for o in (a, b, c) if o != d}
        wait_until(lambda d=d, others=others: others <= senders_used(d), f"{d.name} to use groups from both peers",
                   procs=procs, timeout=120, step=0.25)
    wait_until(lambda: all(len(read_metrics(d)) >= 5 for d in (a, b, c)), "5 rounds on every node",
               procs=procs, timeout=120, step=0.25)
    # same tokenizer: peers' rollouts are tier 0 (their own log-probs), and their behavior ratios
    # are real ones (the peers' policies differ from ours), not SAPO's ratio 1
    tier0 = [r for d in (a, b, c) for r in read_metrics(d) if r.get("ext_t0_samples", 0) > 0]
    assert tier0 and all(r["external_tiers"]["0"] > 0 for r in tier0)
    assert max(abs(r["ext_t0_ratio_mean"] - 1.0) for r in tier0) > 1e-3

    # SIGKILL C mid-run: A and B keep training
    procs[2].send_signal(signal.SIGKILL)
    procs[2].wait(timeout=15)
    killed_at = {d: read_metrics(d)[-1]["round"] for d in (a, b)}
    wait_until(lambda: all(read_metrics(d)[-1]["round"] >= killed_at[d] + 5 for d in (a, b)),
               "A and B to keep training after the kill", procs=procs[:2], timeout=120, step=0.25)
    last_ckpt = int((c / "checkpoints" / "LATEST").read_text().strip().split("-")[1])

    # C restarts with the same key and run dir: resumes its checkpoint and is accepted again
    procs[2] = start(processes, c, bootstrap, args=args)
    wait_until(lambda: read_metrics(c) and read_metrics(c)[-1]["round"] > last_ckpt + 2, "C to resume",
               procs=procs, timeout=120, step=0.25)
    assert node_info(c)["peer_id"] == ids[c]
    rounds_c = [r["round"] for r in read_metrics(c)]
    assert rounds_c == list(range(len(rounds_c)))  # resumed at last_ckpt + 1, nothing lost or repeated
    restart_round = {d: read_metrics(d)[-1]["round"] for d in (a, b)}
    for d in (a, b):
        wait_until(lambda d=d: ids[c] in senders_used(d, since_round=restart_round[d]),
                   f"{d.name} to use C's groups again after the restart", procs=procs, timeout=120, step=0.25)

    # the control service reports the same picture
    status = subprocess.run([sys.executable, "-m", "node.cli", "status", "--run-dir", str(a)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60,
                            env=repo_env())
    assert status.returncode == 0, status.stderr
    assert ids[b] in status.stdout and ids[c] in status.stdout and "recent rounds" in status.stdout
    assert "transport p2pd: daemon running" in status.stdout, status.stdout
    assert "swarm-node/test/rollouts/v1=2" in status.stdout.split("topic peers:")[1], status.stdout


def test_a_node_whose_peer_is_unreachable_trains_alone_and_keeps_dialing(tmp_path, identity, processes):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ghost = f"/ip4/127.0.0.1/tcp/{port}/p2p/{identity().peer_id()}"
    a = tmp_path / "alone"
    procs = [start(processes, a, [ghost])]
    wait_until(lambda: len(read_metrics(a)) >= 5, "5 rounds without any peer", procs=procs, timeout=120, step=0.25)

    def dial_failures() -> int:
        status = subprocess.run([sys.executable, "-m", "node.cli", "status", "--run-dir", str(a)], cwd=ROOT,
                                capture_output=True, text=True, timeout=60,
                                env=repo_env())
        assert status.returncode == 0, status.stderr
        assert "peers connected 0" in status.stdout
        return int(status.stdout.split("dial_failures=")[1].split(",")[0].split()[0])

    # it keeps redialing (with backoff), it does not give up; polled, since `status` answers in a
    # fraction of a second, possibly before the second dial
    wait_until(lambda: dial_failures() >= 2, "a second failed dial", procs=procs, timeout=60, step=0.25)
    assert any(r.get("peers_connected") == 0 for r in read_metrics(a))


TINY_SMALL = ["join", "--preset", "tiny", "--rounds", "5000", "--quiet", "--listen", "/ip4/127.0.0.1/tcp/0",
              "--mix", "4/4", "--set", "swarm.min_round_s=0.4", "--set", "run.threads=1", "--swarm", "mixed"]
SMOL_ON_SYNTHETIC = ["join", "--preset", "smollm2", "--rounds", "400", "--quiet", "--listen", "/ip4/127.0.0.1/tcp/0",
                     "--mix", "2/4", "--set", "tasks.source=synthetic",
                     "--set", "tasks.datasets={copy = 1.0, succ = 1.0, max = 1.0}",
                     "--set", "sampling.group_size=4", "--set", "sampling.max_new_tokens=12",
                     "--set", "verifier.format_weight=0.0", "--set", "run.checkpoint_every=50",
                     "--set", "run.threads=1", "--swarm", "mixed", *WITH_CLAIMS]


def test_tiny_and_smollm2_share_across_tokenizers(tmp_path, processes):
    """Different tokenizers: the tiny node's one-character answers reach the SmolLM2 node as tier 1
    (log-probs aligned on shared character boundaries, or demoted by the trust gate: counted);
    SmolLM2's prose is not in the tiny vocabulary and is refused as untokenizable, never trained."""
    tiny, smol = tmp_path / "tiny", tmp_path / "smol"
    procs = [start(processes, tiny, args=TINY_SMALL)]
    wait_until(lambda: (tiny / "node.json").exists(), "the tiny node to listen", procs=procs, timeout=90, step=0.25)
    procs.append(start(processes, smol, node_info(tiny)["listen_addrs"], args=SMOL_ON_SYNTHETIC))

    def smol_used_tier1() -> bool:
        return any(r.get("external_tiers", {}).get("1", 0) > 0 for r in read_metrics(smol))

    wait_until(smol_used_tier1, "the SmolLM2 node to train on tier-1 rollouts", procs=procs, timeout=240, step=0.25)
    rows = [r for r in read_metrics(smol) if r.get("external_tiers", {}).get("1", 0) > 0]
    assert all(r["external_tier_reasons"].get("other_tokenizer", 0) > 0 for r in rows)
    # in the learner a tier-1 sample is either aligned or demoted by the trust gate, never lost
    assert all(r.get("ext_t1_samples", 0) + r.get("ext_trust_demoted", 0) > 0 for r in rows)
    status = subprocess.run([sys.executable, "-m", "node.cli", "status", "--run-dir", str(smol)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60,
                            env=repo_env())
    assert status.returncode == 0 and "tier 1=" in status.stdout, status.stdout + status.stderr


def test_four_nodes_survive_their_bootstrap_node_and_rejoin_from_the_peer_cache(tmp_path, processes):
    """p2pd: B, C and D know only A; the DHT connects them to each other, so killing A does not
    split the swarm, and D restarted with no --peers finds B and C through <run_dir>/peers.json."""
    a, b, c, d = (tmp_path / n for n in "abcd")
    procs = [start(processes, a)]
    wait_until(lambda: (a / "node.json").exists(), "node A to listen", procs=procs, timeout=150, step=0.25)
    bootstrap = node_info(a)["listen_addrs"]
    procs += [start(processes, n, bootstrap) for n in (b, c, d)]
    wait_until(lambda: all((n / "node.json").exists() for n in (b, c, d)), "B, C and D to listen", procs=procs,
               timeout=150, step=0.25)  # three processes importing torch at once on two busy cores
    ids = {n: node_info(n)["peer_id"] for n in (a, b, c, d)}
    # node.json is written once a node listens, before it has dialed anyone: killing A then raced
    # the others' first dial (B, refused, stayed alone). Kill A once the DHT has met them.
    wait_until(lambda: all((read_metrics(n) or [{}])[-1].get("peers_connected", 0) >= 2 for n in (b, c, d)),
               "B, C and D to meet each other through A", procs=procs, timeout=120, step=0.25)

    procs[0].send_signal(signal.SIGKILL)  # the only node anybody was told about
    procs[0].wait(timeout=15)
    survivors = (b, c, d)
    killed_at = {n: (read_metrics(n) or [{"round": -1}])[-1]["round"] for n in survivors}
    for n in survivors:
        others = {ids[o] for o in survivors if o != n}
        wait_until(lambda n=n, others=others: others <= senders_used(n, since_round=killed_at[n]),
                   f"{n.name} to use groups from both other survivors after A died",
                   procs=procs[1:], timeout=120, step=0.25)
    wait_until(lambda: {ids[b], ids[c]} <= set(json.loads((d / "peers.json").read_text())["peers"]),
               "D to remember B and C in its peer cache", procs=procs[1:], timeout=30, step=0.25)

    procs[3].send_signal(signal.SIGKILL)
    procs[3].wait(timeout=15)
    procs[3] = start(processes, d)  # no --peers: only the peer cache
    restart_round = {n: read_metrics(n)[-1]["round"] for n in (b, c)}
    for n in (b, c):
        wait_until(lambda n=n: ids[d] in senders_used(n, since_round=restart_round[n]),
                   f"{n.name} to use D's groups after D rejoined from its cache",
                   procs=procs[1:], timeout=120, step=0.25)


@pytest.mark.serial  # connection counts a busy machine's slow dials push over the bound
def test_five_nodes_held_to_three_connections_each_still_share_through_relays(tmp_path, processes):
    """The bounded mesh at join level: conn_high = 3 among 5 nodes (all four joiners dial A first, and
    A trims), conn_low = 2 (with everyone at 2 or more, 5 nodes cannot split in two). Groups reach
    every node through GossipSub's relays, and every node trains on all four others' groups."""
    high = 3
    bounded = [*ARGS, "--set", "swarm.p2pd.conn_low=2", "--set", f"swarm.p2pd.conn_high={high}",
               "--set", "swarm.p2pd.conn_grace_s=1"]
    dirs = [tmp_path / n for n in "abcde"]
    procs = [start(processes, dirs[0], args=bounded)]
    wait_until(lambda: (dirs[0] / "node.json").exists(), "node A to listen", procs=procs, timeout=150, step=0.25)
    bootstrap = node_info(dirs[0])["listen_addrs"]
    procs += [start(processes, d, bootstrap, args=bounded) for d in dirs[1:]]
    wait_until(lambda: all((d / "node.json").exists() for d in dirs), "every node to listen",
               procs=procs, timeout=150, step=0.25)
    ids = {d: node_info(d)["peer_id"] for d in dirs}
    for d in dirs:
        others = {ids[o] for o in dirs if o != d}
        wait_until(lambda d=d, others=others: others <= senders_used(d), f"{d.name} to use groups from all four",
                   procs=procs, timeout=240, step=0.25)
    shared_at = {d: read_metrics(d)[-1]["round"] for d in dirs}
    wait_until(lambda: all(read_metrics(d)[-1]["round"] >= shared_at[d] + 5 for d in dirs), "5 more rounds",
               procs=procs, timeout=120, step=0.25)
    # the bound holds: a node may briefly hold one more (a DHT query's dial, inside its grace
    # period), so the median over the last 5 rounds is compared with the bound
    late = {d.name: [r["peers_connected"] for r in read_metrics(d) if r["round"] > shared_at[d]][-5:] for d in dirs}
    assert all(statistics.median(counts) <= high for counts in late.values()), late
