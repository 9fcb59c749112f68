"""`<run_dir>/peers.json`: multiaddrs of recently connected peers, so a restarted node rejoins
without its original bootstrap peer. Written atomically (temp file + rename); a missing or
corrupt file is an empty cache, never an error."""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

MAX_PEERS = 64
MAX_AGE_S = 7 * 24 * 3600.0


class PeerCache:
    def __init__(self, path: Path, max_peers: int = MAX_PEERS, max_age_s: float = MAX_AGE_S) -> None:
        self.path = Path(path)
        self.max_peers = max_peers
        self.max_age_s = max_age_s

    def load(self) -> dict[str, dict]:
        """peer id -> {"addrs": [multiaddr, ...], "seen": unix time}, freshest first."""
        try:
            raw = json.loads(self.path.read_text())
            peers = {str(pid): {"addrs": [str(a) for a in entry["addrs"]][:8], "seen": float(entry["seen"])}
                     for pid, entry in raw["peers"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            log.warning("ignoring unreadable peer cache %s (%s)", self.path, err)
            return {}
        cutoff = time.time() - self.max_age_s
        fresh = sorted(((p, e) for p, e in peers.items() if e["seen"] >= cutoff), key=lambda pe: -pe[1]["seen"])
        return dict(fresh[: self.max_peers])

    def dial_addrs(self) -> list[str]:
        """Full multiaddrs (…/p2p/<id>) to dial, freshest peers first."""
        return [f"{a}/p2p/{pid}" for pid, e in self.load().items() for a in e["addrs"] if "/p2p/" not in a]

    def remember(self, seen_now: dict[str, list[str]]) -> None:
        """Merge peers connected now (peer id -> transport multiaddrs) into the file."""
        if not seen_now:
            return
        peers = self.load()
        now = time.time()
        for pid, addrs in seen_now.items():
            if addrs:
                peers[pid] = {"addrs": list(dict.fromkeys(addrs))[:8], "seen": now}
        freshest = dict(sorted(peers.items(), key=lambda pe: -pe[1]["seen"])[: self.max_peers])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump({"peers": freshest}, handle, indent=1)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
