"""`import proto` where neither grpcio-tools nor hivemind is installed (an installed node on the memory or
py-libp2p transport, a GPU box running scripts/gpu_run.sh): the wire code built elsewhere is used as it
is, and what cannot be built says what to install.

The environment is simulated in a subprocess: the package is copied out of the repository (as a wheel
installs it: swarm.proto, the code and the built proto/_generated/), and an import hook makes
`grpc_tools` and `hivemind` absent, as they are where only the wheel's other dependencies are installed.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.hidden_modules import hiding_source
from proto import _codegen

REPO = Path(__file__).resolve().parents[2]

PROBE = hiding_source(("grpc_tools", "hivemind")) + """
import json
import proto
envelope = proto.Envelope(protocol_version=1, kind=1)
same = proto.Envelope.FromString(envelope.SerializeToString()) == envelope
try:
    proto.p2pd_control_pb2
    daemon = 'ok'
except ImportError as exc:
    daemon = str(exc)
print(json.dumps({'same': same, 'daemon': daemon,
                  'loaded': sorted(m for m in sys.modules if m.split('.')[0] in ('grpc_tools', 'hivemind'))}))
"""


def installed_copy(site: Path, with_daemon_code: bool) -> Path:
    """proto/ as a wheel installs it (no caches, no lock), under `site`."""
    target = site / "proto"
    shutil.copytree(REPO / "proto", target, ignore=shutil.ignore_patterns("__pycache__", ".lock", ".build-*"))
    if not with_daemon_code:
        (target / "_generated" / _codegen.DAEMON_MODULE).unlink(missing_ok=True)
        (target / "_generated" / _codegen.DAEMON_STAMP_NAME).unlink(missing_ok=True)
    return target


def probe(site: Path) -> tuple[subprocess.CompletedProcess, dict | None]:
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=site, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
                            capture_output=True, text=True, timeout=60)
    lines = result.stdout.strip().splitlines()
    return result, json.loads(lines[-1]) if result.returncode == 0 and lines else None


def mtimes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.is_file()}  # a lock would be a file too


@pytest.fixture(autouse=True)
def built():
    _codegen.ensure_generated()
    if _codegen.installed_daemon_proto() is not None:
        _codegen.ensure_daemon_generated()


@pytest.mark.parametrize("with_daemon_code", [True, False])
def test_proto_imports_without_grpcio_tools_and_hivemind(tmp_path, with_daemon_code):
    if with_daemon_code and not (_codegen.OUT_DIR / _codegen.DAEMON_MODULE).is_file():
        pytest.skip("no daemon code was built here (hivemind not installed)")
    target = installed_copy(tmp_path, with_daemon_code)
    before = mtimes(target / "_generated")
    result, out = probe(tmp_path)
    assert out is not None, result.stderr
    assert out["same"] and out["loaded"] == []
    assert mtimes(target / "_generated") == before  # nothing was regenerated
    if with_daemon_code:  # built where hivemind was: used as it is
        assert out["daemon"] == "ok"
    else:  # only the p2pd transport needs it, and it says what to install
        assert "hivemind==1.1.12" in out["daemon"] and "memory" in out["daemon"]


def test_a_changed_proto_without_grpcio_tools_is_a_clear_error(tmp_path):
    target = installed_copy(tmp_path, with_daemon_code=False)
    (target / "swarm.proto").write_text((target / "swarm.proto").read_text() + "\nmessage Extra { string note = 1; }\n")
    result, out = probe(tmp_path)
    assert out is None and result.returncode != 0
    assert "grpcio-tools is not installed" in result.stderr and "scripts/gen_proto.sh" in result.stderr


def test_generated_code_the_protobuf_runtime_rejects_is_stale(tmp_path):
    """A stamp that matches is not enough: code from a newer protoc than the runtime is rebuilt."""
    out_dir = tmp_path / "_generated"
    shutil.copy(_codegen.PROTO_FILE, tmp_path / "swarm.proto")
    _codegen.ensure_generated(proto_file=tmp_path / "swarm.proto", out_dir=out_dir)
    assert _codegen.is_fresh(tmp_path / "swarm.proto", out_dir)
    module = out_dir / "swarm_pb2.py"
    text = module.read_text()
    newer = text.replace("_runtime_version.Domain.PUBLIC,\n    6,", "_runtime_version.Domain.PUBLIC,\n    99,", 1)
    assert newer != text
    module.write_text(newer)
    assert not _codegen.is_fresh(tmp_path / "swarm.proto", out_dir)
    assert _codegen.ensure_generated(proto_file=tmp_path / "swarm.proto", out_dir=out_dir) is True
    assert _codegen.is_fresh(tmp_path / "swarm.proto", out_dir)
