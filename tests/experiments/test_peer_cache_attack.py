"""Issue 16 with real p2pd daemons on 127.0.0.1 (scripts/experiments/peer_cache.py): an honest peer whose
group the node used, then short-lived attacker hosts that connect and leave. Afterwards peers.json
ranks the honest peer first, never held more than its bound of departed hosts, the node gave up on
them after a bounded number of failed redials, and a node restarted from the cache as it was when
they left dials the honest peer first.
Prints one `FIGURES {...}` line (pytest -s)."""
from __future__ import annotations

import json

import pytest

from protocol.transports.p2pd.daemon import DaemonStartError, daemon_binary
from protocol.transports.p2pd.peer_cache import PeerCacheLimits
from scripts.experiments.peer_cache import run

pytestmark = pytest.mark.slow

try:
    daemon_binary()
except DaemonStartError as missing:  # pragma: no cover - setup.sh installs hivemind
    pytest.skip(str(missing), allow_module_level=True)


def test_attackers_that_connect_and_leave_cannot_fill_the_peer_cache(tmp_path):
    bound, failures, attackers = 3, 3, 8
    limits = PeerCacheLimits(max_unproven=bound, max_dial_failures=failures)
    result = run(tmp_path, attackers=attackers, after_s=6.0, cache_kwargs={"peer_cache_limits": limits},
                 expect_cached=bound)
    print("FIGURES", json.dumps(result))
    assert result["cache_at_departure"][0] == "honest", result  # though the attackers were seen later
    assert result["honest_first"], result
    assert result["most_dead_cached_after_leaving"] <= bound, result
    assert result["cache_after"].count("attacker") <= bound, result
    # only cached hosts are redialed, each at most `failures` times; the old cache redialed all of
    # them with backoff for as long as the node ran
    assert result["failed_redials"] <= bound * failures, result
    assert result["restart_first_dial"] == "honest", result
