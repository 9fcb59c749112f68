"""The `[swarm]` section: networking for `swarm-node join`, with one nested section per option type.

    swarm.*             where a user looks first: name, transport, listen, peers, identity, the I/J mix
                        (external_per_round), control, metrics_listen, ...
    swarm.peer_cache.*  the p2pd peer cache          -> PeerCacheLimits (`enabled`: use one)
    swarm.p2pd.*        flood cut, connection bounds -> P2pdOptions (with the transport's own fields)
    swarm.ingest.*      background ingest's budget   -> IngestBudget (`mode`: where ingest runs)
    swarm.pool.*        the pool of peers' groups    -> GroupPool's keyword parameters
    swarm.admission.*   young keys and content dedup -> Admission's keyword parameters
    swarm.nat.*         AutoNAT, relays, port mapping -> NatOptions (with swarm.relays and swarm.announce:
                        addresses, like listen and peers, stay at the top)

Each nested section's keys are the field names of what it maps onto, one to one (tests/unit/config/test_config.py
checks it), so no caller copies fields one by one. The sections are pure data: the runtime side
builds its objects from them (IngestBudget.from_config, GroupPool.from_config, Admission.from_config
in node/peers/; the transport's options in node/service/network.py), so the config imports no
transport and no feature module and `swarm-node config` loads none.

The flat keys of earlier releases (`swarm.peer_cache_max_peers`, `swarm.ingest = "inline"`, ...) are
refused with the key that replaced them (RENAMED_KEYS), whether they come from a TOML file, an
environment variable or `--set`; `migrate_renamed_keys` rewrites a saved configuration (a checkpoint's
config.json) written before the move.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from node.observe.address import parse_listen


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PeerCacheConfig(_Section):
    """swarm.peer_cache: the p2pd peer cache (protocol/transports/p2pd/peer_cache.py)."""

    enabled: bool = Field(True, description="p2pd: remember connected peers in <run_dir>/peers.json and dial "
                          "them at start (best first: live peers before dead ones, i.e. ones whose last "
                          "max_dial_failures dials failed; within each, peers whose verified groups we used in "
                          "the most rounds, then peers that answered our dials, then the rest; most recent "
                          "first), so a restarted node rejoins without --peers")
    max_peers: int = Field(64, ge=1, description="p2pd peer cache: entries at most")
    max_per_group: int = Field(8, ge=1, description="p2pd peer cache: entries per address group at most (a /16 of "
                               "IPv4, a /32 of IPv6; see the prefixes below), so one network range cannot fill the "
                               "cache; best-ranked kept; at most half of them dead, so a wave of short-lived hosts "
                               "cannot hold a group for an hour")
    ipv4_prefix: int = Field(16, ge=0, le=32, description="p2pd peer cache: IPv4 addresses sharing this many "
                             "leading bits form one address group (32: one group per IP)")
    ipv6_prefix: int = Field(32, ge=0, le=128, description="p2pd peer cache: IPv6 address group prefix")
    max_unproven: int = Field(8, ge=0, description="p2pd peer cache: entries at most that were never useful (no "
                              "verified group of theirs used) nor answered a dial of ours: hosts that connect and "
                              "leave cost nothing, so they get few places")
    max_dial_failures: int = Field(3, ge=1, description="p2pd peer cache: a cached peer is no longer redialed "
                                   "after this many failed dials in a row (bootstrap peers always are), and is "
                                   "evicted (a useful or answering one only after also being silent an hour)")


class P2pdConfig(_Section):
    """swarm.p2pd: the go-libp2p daemon transport's flood cut and connection bounds (P2pdOptions)."""

    flood_cut_rate: float = Field(80.0, ge=0, description="p2pd: a GossipSub origin sending more than this many "
                                  "messages/s (beyond flood_cut_burst) is cut: its messages are dropped and the "
                                  "daemon disconnects it, so its flood cannot fill the daemon's fixed queues, where "
                                  "honest messages were lost with it (0: off)")
    flood_cut_burst: float = Field(200.0, ge=1, description="p2pd: messages an origin may send at once before "
                                   "flood_cut_rate applies (an honest node publishes at most 100 at once)")
    flood_cut_s: float = Field(300.0, gt=0, description="p2pd: how long a cut origin stays cut (disconnected "
                               "again whenever it reconnects or sends, and never dialed)")
    conn_low: int = Field(6, ge=1, description="p2pd: below this many connections the node looks for peers "
                          "(dials its --peers and cached peers, asks the DHT); from it on it does neither, so a "
                          "swarm of thousands costs each node about conn_low..conn_high connections")
    conn_high: int = Field(12, ge=0, description="p2pd: above this many connections the node closes connections "
                           "down to conn_low (gossip-only peers first, then the newest; GossipSub needs a mesh of "
                           "6); 0 = unbounded: stay connected to every peer met, dial every known peer and ask the "
                           "DHT every round")
    conn_grace_s: float = Field(20.0, ge=0, description="p2pd: a new connection is never closed for the bound "
                                "before this many seconds (time to subscribe and join the mesh)")
    relayed_streams: int = Field(16, ge=1, description="p2pd: streams from peers reached through a relay only "
                                 "read at once; when full, a new stream displaces the oldest stream of the "
                                 "sender holding the most, so streams that trickle bytes cannot keep anyone out")
    relayed_streams_per_sender: int = Field(2, ge=1, description="p2pd: relayed streams read at once from one "
                                            "sender; its next displaces its own oldest")
    relayed_stream_grace_s: float = Field(5.0, gt=0, description="p2pd: a relayed stream is cut unless it ends "
                                          "within this many seconds plus the bytes it delivered / relayed_min_rate")
    relayed_min_rate: float = Field(4096.0, ge=0, description="p2pd: bytes/s a relayed stream must keep up, past "
                                    "relayed_stream_grace_s, not to be cut (0: every stream ends within the grace)")
    direct_peers: int = Field(4, ge=0, description="p2pd: our own messages also go on acknowledged streams to this "
                              "many of the peers whose groups we used most recently, beside gossip: a spread flood "
                              "fills the daemons' fixed queues and cost two such peers a third of each other's "
                              "messages (0: gossip only)")

    @model_validator(mode="after")
    def _connection_bounds_ordered(self) -> "P2pdConfig":
        if self.conn_high and self.conn_low > self.conn_high:
            raise ValueError(f"conn_low = {self.conn_low} exceeds conn_high = {self.conn_high}: set conn_low <= "
                             "conn_high, or conn_high = 0 for unbounded connections")
        return self


class IngestConfig(_Section):
    """swarm.ingest: where peers' messages are checked on arrival, and background ingest's budget (IngestBudget)."""

    mode: Literal["background", "inline"] = Field(
        "background", description="where `join` checks peers' messages on arrival: background (a worker thread with a "
                                  "per-round budget; rounds never wait on ingest) or inline (in collect, as the "
                                  "in-process memory testnet does for determinism)")
    max_messages: int = Field(64, ge=1, description="background ingest: messages checked per round at most")
    max_share: float = Field(0.05, gt=0, le=1, description="background ingest: share of wall time spent "
                             "checking at most (it competes with training for the GIL)")
    max_wait_s: float = Field(10.0, gt=0, description="background ingest: a message staged longer than this is "
                              "dropped unchecked when its sender's turn comes (that turn checks the sender's "
                              "next fresh one)")
    staged_per_sender: int = Field(64, ge=1, description="messages waiting per delivering peer; beyond it that "
                                   "peer's oldest are dropped (counted)")
    staged_max: int = Field(2048, ge=1, description="messages waiting in all; beyond it the heaviest sender's "
                            "oldest are dropped (counted)")
    staged_max_bytes: int = Field(64 * 1024 * 1024, ge=1, description="bytes waiting in all; beyond it the sender "
                                  "holding the most bytes loses its oldest (counted); young senders hold at most "
                                  "young_share of it")
    young_share: float = Field(0.25, gt=0, le=1, description="background ingest: young and unknown senders "
                               "together get at most this share of each round's checking budget and of "
                               "staging; established senders are served first with the rest (1,000 fresh origins "
                               "must not crowd an established peer out). Until some key is "
                               "established, young senders share the whole budget")


class PoolConfig(_Section):
    """swarm.pool: the bounded pool of peers' groups (node/peers/pool.py GroupPool)."""

    max_groups: int = Field(256, ge=1, description="peer groups kept at most, checked cheaply and verified when "
                            "picked (the heaviest sender's oldest go first)")
    max_age_rounds: int = Field(5, ge=0, description="a pooled group is dropped this many rounds after it was "
                                "pooled (its behaviour log-probs grow stale as we train)")
    max_age_s: float = Field(60.0, gt=0, description="join (background ingest): a pooled group is also dropped "
                             "this many seconds after it was pooled, whichever comes first")
    max_per_sender: int = Field(32, ge=1, description="no peer holds more of the pool than this")
    bench_rounds: int = Field(4, ge=1, description="a key whose picked or audited group failed verification "
                              "(blamed or not) is benched this many rounds: its groups are not picked, and it "
                              "goes to the back of the young keys' line (node/peers/bench.py)")
    bench_seconds: float = Field(30.0, ge=0, description="join (background ingest): a benched key also sits out "
                                 "this many seconds (both must pass)")
    bench_strikes: int = Field(3, ge=0, description="unverifiable results (score_timeout, score_refused, too_long, "
                               "untokenizable, group_too_long) a key may have since its last verified group "
                               "before each further one doubles its bench; they never touch its ban score")


class AdmissionConfig(_Section):
    """swarm.admission: young keys' share and content dedup (node/peers/admission.py Admission)."""

    young_share_max: float = Field(0.25, ge=0, le=1, description="young keys together hold at most this share of "
                                   "the external mix (of the J slots in a round with no established group; keys are "
                                   "free: 100 fresh keys must not own the mix)")
    young_groups: int = Field(8, ge=0, description="a key stays young until this many of its verified, non-duplicate "
                              "groups were credited: trained on, or (zero reward variance) picked by a young slot "
                              "(0 with young_rounds 0: no key is young)")
    young_rounds: int = Field(20, ge=0, description="a key also stays young until this many rounds after its first "
                              "verified group")
    young_seconds: float = Field(300.0, ge=0, description="join (background ingest): a key also stays young until "
                                 "this many seconds after its first verified group (rounds alone mean nothing at 50 "
                                 "rounds/s), except the first key established in a new swarm (the bootstrap window)")
    establish_interval_s: float = Field(60.0, ge=0, description="join (background ingest): after the first, at most "
                                        "one key per network group (the delivering host's /16, IPv6 /32, or relay) "
                                        "becomes established per this many seconds, in turn within the group: fresh "
                                        "keys from one place cannot buy weight faster, and never queue a newcomer "
                                        "from elsewhere behind them")
    max_promotions_per_interval: int = Field(16, ge=1, description="join: keys established per establish_interval_s "
                                             "across all network groups at most")
    max_established_per_group: int = Field(8, ge=1, description="join: established keys per network group at most "
                                           "(one host or subnet cannot hold more of the established share)")
    bootstrap_young_fraction: float = Field(0.25, ge=0, le=1, description="join: in a new swarm (no key established "
                                            "yet) a key named by --peers or swarm.relays is established as soon as it "
                                            "earned its credits and rounds; any other key waits this fraction of "
                                            "young_seconds")
    establish_decay_s: float = Field(21600.0, ge=0, description="join: an established key none of whose groups was "
                                     "credited for this many seconds is young again (0: never)")
    dedup_rounds: int = Field(1000, ge=0, description="a group whose content (prompt + completion texts) was credited "
                              "(trained on) within this many rounds is refused as duplicate_content, whoever signed it")
    dedup_seconds: float = Field(600.0, ge=0, description="join (background ingest): credited content is also "
                                 "remembered at least this many seconds (1000 rounds are 20 s at 50 rounds/s), "
                                 "200,000 digests at most")


class NatConfig(_Section):
    """swarm.nat: being reachable from outside on p2pd (NatOptions; docs/joining-a-swarm.md "Joining
    from behind NAT")."""

    reachability: Literal["auto", "public", "private"] = Field(
        "auto", description="auto: AutoNAT (peers dial us back) tells whether others can reach us (public) or not "
                            "(private: behind NAT or a firewall); public / private: skip the test (a rented box "
                            "with a public address; a node known to sit behind NAT)")
    autonat_service: bool = Field(True, description="dial peers back when they ask whether they are reachable, and "
                                  "turn relayed connections into direct ones by hole punching where both NATs allow "
                                  "(the daemon ties the two together)")
    relay_client: bool = Field(True, description="once private: hold a slot on the relays (swarm.relays, else the "
                               "--peers) and announce the relayed addresses, so peers reach us through them")
    relay_service: bool = Field(True, description="once public: serve relay slots to private peers (fixed limits: "
                                "128 KiB each way and 2 minutes per relayed connection, 16 per peer, 128 slots); "
                                "relayed messages pass the same flood cut and checks as gossip. With relay_client "
                                "on, the bundled daemon answers relay requests anyway; both off: no relaying at all")
    port_map: bool = Field(False, description="ask the home router to forward a port (UPnP / NAT-PMP)")


# the flat admission keys of the release that moved them (keys added since never were flat)
FLAT_ADMISSION_KEYS = ("young_share_max", "young_groups", "young_rounds", "young_seconds", "establish_interval_s",
                       "dedup_rounds", "dedup_seconds")
# swarm.p2pd's keys that were flat before the move (later ones, such as relayed_streams, never were)
FLAT_P2PD_KEYS = ("flood_cut_rate", "flood_cut_burst", "flood_cut_s", "conn_low", "conn_high", "conn_grace_s")
# old flat key -> the key that replaced it (a nested section's)
RENAMED_KEYS: dict[str, str] = {
    **{f"swarm.peer_cache_{k}": f"swarm.peer_cache.{k}" for k in PeerCacheConfig.model_fields if k != "enabled"},
    "swarm.peer_cache": "swarm.peer_cache.enabled",
    **{f"swarm.{k}": f"swarm.p2pd.{k}" for k in FLAT_P2PD_KEYS},
    **{f"swarm.ingest_{k}": f"swarm.ingest.{k}" for k in IngestConfig.model_fields
       if k not in ("mode", "staged_max_bytes")},  # (staged_max_bytes came after the sections)
    "swarm.ingest": "swarm.ingest.mode",
    **{f"swarm.pool_{k}": f"swarm.pool.{k}" for k in ("max_groups", "max_age_rounds", "max_age_s",
                                                       "max_per_sender")},  # the pool's keys before the move
    **{f"swarm.{k}": f"swarm.admission.{k}" for k in FLAT_ADMISSION_KEYS},
}
# old keys whose name is now a section's: only a value that is not a table is the old key
BECAME_SECTIONS = {old for old, new in RENAMED_KEYS.items() if new.startswith(old + ".")}


def renamed_message(old: str) -> str:
    return (f"{old} is now {RENAMED_KEYS[old]} (swarm's keys moved into sections: peer_cache, p2pd, ingest, pool, "
            "admission)")


def old_scalar(key: str, value: Any) -> bool:
    """`value` at `key` is an old flat key's (swarm.peer_cache = true), not the section that replaced it."""
    return key in BECAME_SECTIONS and not isinstance(value, (dict, BaseModel))


def migrate_renamed_keys(data: dict) -> dict:
    """A saved configuration (a checkpoint's config.json) with its old flat swarm keys moved to the
    keys that replaced them; a copy, `data` untouched. User input is never migrated: it is refused
    (node/config/schema.py) so the user learns the new key."""
    if not isinstance(data.get("swarm"), dict):
        return dict(data)
    swarm = dict(data["swarm"])
    scalars = {old: swarm.pop(old[len("swarm."):]) for old in BECAME_SECTIONS
               if old_scalar(old, swarm.get(old[len("swarm."):], {}))}
    moved = {old: swarm.pop(old[len("swarm."):]) for old in RENAMED_KEYS
             if old not in BECAME_SECTIONS and old[len("swarm."):] in swarm}
    for old, value in {**scalars, **moved}.items():
        section, key = RENAMED_KEYS[old][len("swarm."):].split(".")
        swarm[section] = {**swarm.get(section, {}), key: value}
    return {**data, "swarm": swarm}


class SwarmConfig(_Section):
    """Networking for `swarm-node join` (ignored by `swarm-node train`, but for metrics_listen)."""

    name: str = Field("main", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="swarm name: the gossip topics")
    transport: Literal["p2pd", "libp2p", "memory"] = Field(
        "p2pd", description="p2pd: GossipSub + DHT through the go-libp2p daemon in the hivemind wheel; libp2p: "
                            "pure-Python py-libp2p GossipSub; memory: in-process bus (tests and simulations only)")
    listen: list[str] = Field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"],
                              description="listen multiaddrs; tcp/0 = a free port (printed at start and in "
                                          "node.json), so several nodes share a host without conflicts")
    peers: list[str] = Field(default_factory=list, description="bootstrap multiaddrs ending in /p2p/<peer-id>")
    relays: list[str] = Field(default_factory=list, description="p2pd: relay multiaddrs ending in /p2p/<peer-id> "
                              "that a private node holds a slot on (empty: the --peers)")
    announce: list[str] = Field(default_factory=list, description="p2pd: the addresses announced to peers instead of "
                                "the listen ones, e.g. /ip4/<public ip>/tcp/4001 on a box behind its provider's NAT")
    nat: NatConfig = Field(default_factory=NatConfig)
    peer_cache: PeerCacheConfig = Field(default_factory=PeerCacheConfig)
    p2pd: P2pdConfig = Field(default_factory=P2pdConfig)
    identity: str | None = Field(None, description="key file; default <run_dir>/identity.key")
    external_per_round: int = Field(4, ge=0, description="J: external groups per update (SAPO I/J mix)")
    audit_per_round: int = Field(2, ge=0, description="peer groups verified each round although the mix did not "
                                 "pick them (one of the latest of randomly chosen senders): a sender of wrong rewards is "
                                 "caught even when its groups are never picked")
    audit_max_bytes: int = Field(32 * 1024 * 1024, ge=1, description="bytes the audit keeps of senders' "
                                 "unverified groups at most (4 each, 1024 senders); beyond it the sender holding the "
                                 "most loses its oldest")
    verify_budget_s: float = Field(0.5, gt=0, description="seconds per round the training thread may spend "
                                   "verifying peers' groups (the mix's picks and the audit; each scorer deadline is "
                                   "cut to what is left); beyond it the round takes only groups already verified "
                                   "(background ingest verifies picks ahead in its spare budget). In the round's "
                                   "row: t_verify, verify_budget_exhausted")
    pool: PoolConfig = Field(default_factory=PoolConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    max_external_tokens: int | None = Field(None, ge=1, description="refuse a peer completion longer than this in "
                                            "our tokens (None = sampling.max_new_tokens plus an eighth: what we "
                                            "would generate, re-encoded); "
                                            "a group may hold at most 2 * group_size times this many in all")
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    sampling_policy: Literal["uniform", "per_sender", "weak_tasks"] = Field(
        "per_sender", description="which J pooled groups to train on: uniform (SAPO paper), per_sender (fair "
                                  "across senders) or weak_tasks (favour families this node fails, sender-fair)")
    composition: Literal["sapo", "cross_actor"] = Field(
        "sapo", description="sapo: a peer's group trains as its own group; cross_actor: a peer's group for a "
                            "prompt we sampled this round joins our group (one baseline over the union)")
    accept_sender_answers: bool = Field(False, description="score unknown tasks against the sender's answer")
    self_replay: bool = Field(False, description="a silo control (docs/testnets-and-experiments.md "
                              "\"Controls: is it the peers' knowledge?\"): no network; the J external slots are "
                              "filled with this node's own groups with reward variance from its last "
                              "pool.max_age_rounds rounds, picked by sampling_policy and trained exactly as peers' "
                              "groups (loss.off_policy); `train` and the memory testnet only")
    min_round_s: float = Field(0.0, ge=0, description="pace rounds (tiny models finish a round in ms)")
    control: str = Field("127.0.0.1:0", description="gRPC control service address (loopback by default)")
    metrics_listen: str = Field(
        "127.0.0.1:0", description="HOST:PORT of the node's read-only HTTP listener: Prometheus /metrics, a live "
                                   "page at / and its JSON at /api/state (join and train). 127.0.0.1:0 = loopback, "
                                   "a free port (printed at start and written to node.json); empty = off. A "
                                   "non-loopback host (e.g. 0.0.0.0:9100) lets anyone who reaches the port read "
                                   "the node's peer ids, scores, addresses and curves (never its key) and load it "
                                   "with requests: set one only behind a firewall or a reverse proxy")
    fault_file: str | None = Field(None, description="testnets: a JSON file of network faults (delay, loss, blocked "
                                   "peers; protocol/transports/impairment.py) applied to everything this node receives")

    @model_validator(mode="before")
    @classmethod
    def _no_old_scalar(cls, data: Any) -> Any:
        """`peer_cache = false` or `ingest = "inline"` (a TOML file's): the old key, named with its new one.
        (Old flat keys are unknown keys: node/config/schema.py names their new keys.)"""
        if isinstance(data, dict):
            for name, value in data.items():
                if old_scalar(f"swarm.{name}", value):
                    raise ValueError(renamed_message(f"swarm.{name}"))
        return data

    @field_validator("relays", "announce")
    @classmethod
    def _multiaddrs(cls, value: list[str], info) -> list[str]:
        for addr in value:
            if not addr.startswith("/") or (info.field_name == "relays" and "/p2p/" not in addr):
                ending = " ending in /p2p/<peer-id>" if info.field_name == "relays" else ""
                raise ValueError(f"{addr!r} is not a multiaddr{ending} (e.g. /ip4/203.0.113.7/tcp/4001"
                                 f"{'/p2p/12D3KooW...' if ending else ''})")
        return value

    @field_validator("metrics_listen", mode="before")
    @classmethod
    def _metrics_listen_parses(cls, value) -> str:
        value = str(value).strip()  # `--set swarm.metrics_listen=9100` reads as a number: say what is wrong with it
        parse_listen(value)  # raises ValueError saying what is wrong
        return value
