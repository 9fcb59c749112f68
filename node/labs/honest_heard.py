"""Issue 31, "an honest peer is always heard": real `swarm-node join` nodes on p2pd, measured.

Two default join nodes (started as docs/joining-a-swarm.md says) on 127.0.0.1: A unpaced, B paced
(swarm.min_round_s) and dialing A;
phase "quiet" with nobody else, phase "flood" with H `node.hostile.flood_origins` processes that
run K keys (each its own host) sending R valid, distinct, trainable groups a second each, dialing
both nodes. A `Probe` per node polls its status every second (node/observe/control.py) and tails its
metrics.jsonl; `node_figures` turns what it saw in a time window into the acceptance figures:

  honest_trained_fraction   rounds in which the node trained its honest peer's groups, over rounds
                            (metrics rows' `external_used_by_sender`)
  honest_trained_seconds    the same per 1-s poll interval (a node faster than its peer publishes
                            cannot train the peer's groups in every round, but can every second)
  honest_verified_seconds   poll intervals in which the count of the honest peer's messages the node
                            checked grew (status ingest "checked_by_peer/<peer>"; `peers[].accepted`
                            where a node does not report it yet: `verified_source` says which)
  attacker_share            groups trained from any signer but the honest peer, over all trained
  establishment             when attacker keys became established (status "established" entries:
                            see `established_from_reply`) against swarm.admission.young_seconds and
                            swarm.admission.establish_interval_s

scripts/experiments/honest_heard.py drives it (JSON + PNG); tests/experiments/test_honest_heard.py runs it as a test.
Only processes started here are ended, by their Popen handles; every wait is bounded.
"""
from __future__ import annotations

import bisect
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from policy.ground import child_env

ROOT = Path(__file__).resolve().parents[2]
JOIN = ["join", "--preset", "tiny", "--rounds", "1000000", "--quiet", "--listen", "/ip4/127.0.0.1/tcp/0",
        "--set", "run.threads=1"]
VERIFIED_PREFIX = "checked_by_peer/"  # the messages the ingest worker checked, per peer
MIN_INTERVAL_S = 0.5  # polls closer than this are merged into the next interval
ESTABLISHED_KEY = re.compile(r"(?:^|/)established(?:_at)?/([^/]+)$")
MISSING_VERIFIED = ("status has no ingest checked_by_peer/<peer> counters (node/peers/ingest.py snapshot "
                    "'checked_by_peer'); per-second checks fall back to peers[].accepted")
MISSING_ESTABLISHED = ("status carries no established keys: neither a StatusReply field 'established' / "
                       "'admission' nor flattened 'established/<key>' counters (node/observe/control.py status_reply "
                       "copies only the fields it knows; a list of [key, time] is dropped by flat_counts)")


def start_join(run_dir: Path, swarm: str, *extra: str) -> subprocess.Popen:
    """`python -m node.cli join` as docs/joining-a-swarm.md says, on 127.0.0.1, its log beside the run dir."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir.parent / f"{run_dir.name}.log", "ab")
    cmd = [sys.executable, "-m", "node.cli", *JOIN, "--swarm", swarm, "--run-dir", str(run_dir),
           "--identity", str(run_dir / "node.key"), *extra]
    return subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=log, stderr=log)


def split_keys(keys: int, procs: int) -> list[int]:
    """`keys` spread over `procs` processes as evenly as possible (none empty)."""
    procs = max(1, min(procs, keys))
    return [keys // procs + (i < keys % procs) for i in range(procs)]


def start_flooders(out: Path, swarm: str, peers: list[str], keys: int, procs: int, rate: float, seconds: float,
                   transport: str = "libp2p", extra: tuple[str, ...] = ()) -> list[tuple[subprocess.Popen, Path]]:
    """H `node.hostile.flood_origins` processes with `keys` keys between them; (Popen, summary path) each."""
    started = []
    for i, k in enumerate(split_keys(keys, procs)):
        summary = out / f"flooder-{i}.json"
        summary.unlink(missing_ok=True)  # an earlier run's summary would date this flood's start
        log = open(out / f"flooder-{i}.log", "ab")
        cmd = [sys.executable, "-m", "node.hostile.flood_origins", "--keys", str(k), "--rate", str(rate),
               "--peers", *peers, "--swarm", swarm, "--seconds", str(seconds), "--preset", "tiny",
               "--set", "run.threads=1", "--transport", transport, "--out", str(summary), *extra]
        started.append((subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=log, stderr=log), summary))
    return started


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def wait_until(predicate, what: str, procs: list[subprocess.Popen], timeout: float, poll_s: float = 0.25) -> bool:
    """Polls `predicate` until true (True) or `timeout` s (False); raises if a process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"a process exited ({p.returncode}) while waiting for {what}: {p.args[:4]}")
        time.sleep(poll_s)
    return bool(predicate())


class MetricsTail:
    """New complete rows of a metrics.jsonl since the last read (a torn last line waits)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = Path(path), 0

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        rows = []
        for line in data[:end].splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        return rows


def established_from_reply(reply) -> dict[str, dict] | None:
    """{key: {"at": unix time, "first_seen": unix time or None}} from a StatusReply, or None when
    the reply carries no established keys at all. Accepted shapes: a field `established` (or
    `admission.established`) of entries with key/peer_id and at/established_at[/first_seen], or a
    map key -> time; flattened counters "established/<key>" (or ".../established_at/<key>") in the
    ingest or observed maps, the value the unix time in seconds."""
    fields = {f.name for f in reply.DESCRIPTOR.fields}
    source = None
    if "established" in fields:
        source = reply.established
    elif "admission" in fields and "established" in {f.name for f in reply.admission.DESCRIPTOR.fields}:
        source = reply.admission.established
    if source is not None:
        return _entries(source)
    found = {}
    for name in ("ingest", "observed"):
        for key, value in getattr(reply, name).items():
            if (m := ESTABLISHED_KEY.search(key)) and not key.startswith(VERIFIED_PREFIX):
                found[m.group(1)] = {"at": float(value), "first_seen": None}
    return found or None


def _entries(source) -> dict[str, dict]:
    if hasattr(source, "items"):  # a map key -> time
        return {k: {"at": float(v), "first_seen": None} for k, v in source.items()}
    out = {}
    for e in source:
        key = getattr(e, "key", "") or getattr(e, "peer_id", "")
        at = getattr(e, "at", 0.0) or getattr(e, "established_at", 0.0)
        out[key] = {"at": float(at), "first_seen": float(getattr(e, "first_seen", 0.0)) or None}
    return out


@dataclass
class Sample:
    t: float                 # unix time of the poll
    round: int
    verified: dict[str, int]  # delivering peer -> messages verified (ingest), or accepted (fallback)
    verified_source: str
    established: dict[str, dict] | None
    connected: list[str]
    counters: dict[str, int] = field(default_factory=dict)  # rejected_by_reason and ingest (checked_by_peer aside)


@dataclass
class Probe:
    """One node: its status every poll, its metrics rows stamped with the poll that read them."""
    name: str
    run_dir: Path
    samples: list[Sample] = field(default_factory=list)
    rows: list[tuple[float, dict]] = field(default_factory=list)
    status_failures: int = 0

    def __post_init__(self) -> None:
        self.tail = MetricsTail(self.run_dir / "metrics.jsonl")
        self._times: list[float] = []

    def rows_between(self, after: float, until: float) -> list[dict]:
        """Metrics rows read by a poll in (after, until] (rows are in poll order)."""
        lo, hi = bisect.bisect_right(self._times, after), bisect.bisect_right(self._times, until)
        return [r for _, r in self.rows[lo:hi]]

    def info(self) -> dict:
        return read_json(self.run_dir / "node.json") or {}

    def poll(self, timeout_s: float = 5.0) -> Sample | None:
        from node.observe.control import fetch_status  # gRPC: the poller's alone

        now = time.time()
        new_rows = self.tail.read()
        self.rows.extend((now, row) for row in new_rows)
        self._times.extend(now for _ in new_rows)
        address = self.info().get("control")
        if not address:
            return None
        try:
            reply = fetch_status(address, timeout_s=timeout_s)
        except ConnectionError:
            self.status_failures += 1
            return None
        verified = {k[len(VERIFIED_PREFIX):]: int(v) for k, v in reply.ingest.items() if k.startswith(VERIFIED_PREFIX)}
        source = "ingest.checked_by_peer"
        if not verified:
            verified, source = {p.peer_id: int(p.accepted) for p in reply.peers}, "peers.accepted"
        counters = {**{f"rejected/{k}": int(v) for k, v in reply.rejected_by_reason.items()},
                    **{f"ingest/{k}": int(v) for k, v in reply.ingest.items() if not k.startswith(VERIFIED_PREFIX)},
                    **{f"transport/{k}": int(v) for k, v in reply.transport_counters.items()
                       if not k.startswith(("topic_peers:", "daemon_"))}}
        sample = Sample(now, int(reply.round), verified, source, established_from_reply(reply),
                        list(reply.connected_peers), counters)
        self.samples.append(sample)
        return sample


def used(row: dict, sender: str) -> int:
    return int((row.get("external_used_by_sender") or {}).get(sender, 0))


def used_total(row: dict) -> int:
    return int(sum((row.get("external_used_by_sender") or {}).values()))


def spaced(samples: list[Sample], min_dt: float = MIN_INTERVAL_S) -> list[Sample]:
    """The samples at least `min_dt` apart (two polls back to back, as at a phase change, would
    make an interval too short to hold anything)."""
    kept: list[Sample] = []
    for s in samples:
        if not kept or s.t - kept[-1].t >= min_dt:
            kept.append(s)
    return kept


def _intervals(probe: Probe, honest: str, t0: float, t1: float) -> list[dict]:
    """One entry per pair of consecutive status samples inside [t0, t1]: its length, how many of
    the honest peer's messages were verified in it, and whether a round in it trained the peer."""
    samples = spaced([s for s in probe.samples if t0 <= s.t <= t1])
    out = []
    for prev, cur in zip(samples, samples[1:]):
        rows = probe.rows_between(prev.t, cur.t)
        out.append({"t": cur.t, "dt": cur.t - prev.t, "source": cur.verified_source,
                    "verified": cur.verified.get(honest, 0) - prev.verified.get(honest, 0),
                    "rounds": len(rows), "trained": any(used(r, honest) > 0 for r in rows)})
    return out


def _max_gap(intervals: list[dict], t0: float) -> float:
    """Longest stretch (s) without a verified honest message, from t0 to the last sample."""
    last, gap = t0, 0.0
    for iv in intervals:
        if iv["verified"] > 0:
            gap, last = max(gap, iv["t"] - last), iv["t"]
    return max(gap, (intervals[-1]["t"] - last) if intervals else 0.0)


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _fraction(n: int, d: int) -> float | None:
    return round(n / d, 4) if d else None


def node_figures(probe: Probe, honest: str, t0: float, t1: float, settle_s: float = 0.0,
                 attackers: set[str] | None = None) -> dict:
    """The per-node figures of one window [t0, t1] (module docstring). Verification and training
    of the honest peer are counted from t0 + settle_s; the mix share over the whole window."""
    rows = probe.rows_between(t0 + settle_s, t1)
    all_rows = probe.rows_between(t0, t1)
    intervals = _intervals(probe, honest, t0 + settle_s, t1)
    total = sum(used_total(r) for r in all_rows)
    from_honest = sum(used(r, honest) for r in all_rows)
    from_attackers = sum(used(r, k) for r in all_rows for k in attackers) if attackers else None
    verified = [iv["verified"] for iv in intervals]
    return {
        "rounds": len(rows), "rounds_per_s": _fraction(len(rows), max(1e-9, t1 - t0 - settle_s)),
        "honest_trained_rounds": sum(1 for r in rows if used(r, honest) > 0),
        "honest_trained_fraction": _fraction(sum(1 for r in rows if used(r, honest) > 0), len(rows)),
        "honest_trained_seconds": _fraction(sum(iv["trained"] for iv in intervals), len(intervals)),
        "honest_groups_used": sum(used(r, honest) for r in rows),
        "intervals": len(intervals), "interval_s_max": round(max((iv["dt"] for iv in intervals), default=0.0), 2),
        "honest_verified_seconds": _fraction(sum(v > 0 for v in verified), len(verified)),
        "honest_verified_every_second": bool(verified) and all(v > 0 for v in verified),
        "honest_verified_max_gap_s": round(_max_gap(intervals, t0 + settle_s), 2),
        "honest_verified_per_s": _fraction(sum(verified), max(1e-9, sum(iv["dt"] for iv in intervals))),
        "verified_source": intervals[-1]["source"] if intervals else None,
        "groups_used": total, "groups_used_from_honest": from_honest, "rounds_in_window": len(all_rows),
        "rounds_in_window_without_honest": sum(1 for r in all_rows if used(r, honest) == 0),
        "external_received": sum(int(r.get("external_received", 0)) for r in all_rows),
        "external_zero_variance": sum(int(r.get("external_zero_variance", 0)) for r in all_rows),
        "pass_rate_mean": _mean([r["pass_rate"] for r in all_rows if r.get("pass_rate") is not None]),
        "attacker_share": _fraction(total - from_honest, total),
        "attacker_keys_share": _fraction(from_attackers, total) if from_attackers is not None else None,
        "status_failures": probe.status_failures,
        "counters_delta": counters_delta(probe, t0, t1),
    }


def counters_delta(probe: Probe, t0: float, t1: float) -> dict[str, int]:
    """How the node's refusal and ingest counters grew over [t0, t1] (those that grew)."""
    inside = [s for s in probe.samples if t0 <= s.t <= t1]
    if len(inside) < 2:
        return {}
    first, last = inside[0].counters, inside[-1].counters
    return {k: v - first.get(k, 0) for k, v in sorted(last.items()) if v - first.get(k, 0) > 0}


def establishment(sample: Sample | None, honest: str, attackers: set[str], flood_start: float,
                  young_s: float | None, interval_s: float | None, tolerance_s: float = 1.0) -> dict:
    """When keys became established at a node, against the documented rate: after the first key at
    most one per `interval_s` (swarm.admission.establish_interval_s), and no attacker key sooner than `young_s`
    (swarm.admission.young_seconds) after its first message (when the node does not report first_seen: after
    its process started flooding, an upper bound on how long it was known, so a key flagged here
    broke the rule for certain)."""
    if sample is None or sample.established is None:
        return {"available": False, "why": MISSING_ESTABLISHED, "rate_ok": None}
    est = sample.established
    attacker = {k: v for k, v in est.items() if (k in attackers if attackers else k != honest)}
    timed = {k: v for k, v in est.items() if v["at"] > 0}  # 0: promoted in rounds only (no time known)
    attacker_timed = {k: v for k, v in attacker.items() if v["at"] > 0}
    times = sorted(v["at"] for v in timed.values())
    gaps = [b - a for a, b in zip(times, times[1:])]
    fast = [g for g in gaps if interval_s is not None and g < interval_s - tolerance_s]
    after = {k: v["at"] - (v["first_seen"] or flood_start) for k, v in attacker_timed.items()}
    early = [k for k, s in after.items() if young_s is not None and s < young_s - tolerance_s]
    return {"available": True, "established_keys": len(est), "honest_established": honest in est,
            "attacker_established": len(attacker), "untimed": len(est) - len(timed),
            "attacker_established_after_s": sorted(round(s, 1) for s in after.values()),
            "min_gap_s": round(min(gaps), 1) if gaps else None, "gaps_below_interval": len(fast),
            "attacker_sooner_than_young": len(early), "rate_ok": not fast and not early}
