"""`swarm-node keygen`: a 0600 identity whose peer id is printed, never silently overwritten."""
import stat
import subprocess
import sys
from pathlib import Path

from protocol import NodeIdentity

from tests.support.processes import repo_env

ROOT = Path(__file__).resolve().parents[3]


def keygen(*args):
    return subprocess.run([sys.executable, "-m", "node.cli", "keygen", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=repo_env())


def test_keygen_writes_a_private_key_and_prints_its_peer_id(tmp_path):
    key = tmp_path / "node.key"
    out = keygen("--out", str(key))
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    peer_id = out.stdout.strip()
    assert peer_id.startswith("12D3KooW") and NodeIdentity.load(key).peer_id() == peer_id

    again = keygen("--out", str(key))
    assert again.returncode == 2 and "--force" in again.stderr
    assert NodeIdentity.load(key).peer_id() == peer_id  # the old identity is intact
    forced = keygen("--out", str(key), "--force")
    assert forced.returncode == 0 and forced.stdout.strip() != peer_id
