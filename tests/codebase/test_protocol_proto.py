"""proto/: code generation (idempotent, content-based freshness) and the Kind mirror; protocol/
import hygiene."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import proto
from proto import _codegen, swarm_pb2
from protocol.kinds import KIND_SPECS, Kind

REPO = Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh_and_marked():
    assert _codegen.is_fresh()
    init_text = (_codegen.OUT_DIR / "__init__.py").read_text()
    assert "GENERATED" in init_text and "Do not edit" in init_text


def test_codegen_is_idempotent_and_regenerates_when_the_proto_changes(tmp_path):
    proto_file = tmp_path / "swarm.proto"
    out_dir = tmp_path / "_generated"
    shutil.copy(_codegen.PROTO_FILE, proto_file)
    assert _codegen.ensure_generated(proto_file=proto_file, out_dir=out_dir) is True
    assert {p.name for p in out_dir.iterdir()} >= {"__init__.py", "swarm_pb2.py", "swarm_pb2_grpc.py", "STAMP"}
    before = (out_dir / "swarm_pb2.py").stat().st_mtime_ns

    start = time.perf_counter()
    assert _codegen.ensure_generated(proto_file=proto_file, out_dir=out_dir) is False
    assert time.perf_counter() - start < 0.05  # the import-time check is cheap
    assert (out_dir / "swarm_pb2.py").stat().st_mtime_ns == before

    proto_file.write_text(proto_file.read_text() + "\nmessage Extra { string note = 1; }\n")
    assert _codegen.ensure_generated(proto_file=proto_file, out_dir=out_dir) is True
    assert "Extra" in (out_dir / "swarm_pb2.pyi").read_text()

    (out_dir / "swarm_pb2_grpc.py").unlink()  # a half-deleted folder is rebuilt too
    assert _codegen.ensure_generated(proto_file=proto_file, out_dir=out_dir) is True
    assert "from . import swarm_pb2" in (out_dir / "swarm_pb2_grpc.py").read_text()


def test_gen_proto_script_is_idempotent():
    result = subprocess.run(["bash", "scripts/gen_proto.sh"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "up to date" in result.stderr


def test_kind_mirrors_the_proto_enum():
    proto_kinds = {name: value for name, value in swarm_pb2.Envelope.Kind.items() if value != 0}
    assert proto_kinds == {kind.name: kind.value for kind in Kind}
    assert set(KIND_SPECS) == set(Kind)


def test_grpc_stubs_are_available():
    assert hasattr(proto.swarm_pb2_grpc, "NodeControlServicer")
    reply = proto.StatusReply(rejected_by_reason={"bad_signature": 3}, peers=[proto.PeerInfo(peer_id="12D3KooWx", banned=True)])
    assert proto.StatusReply.FromString(reply.SerializeToString()).rejected_by_reason["bad_signature"] == 3


def test_protocol_imports_no_torch_node_policy_or_grpc():
    code = (
        "import sys, protocol, protocol.testing, protocol.bench; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'node', 'policy', 'grpc', 'libp2p', 'numpy')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_generated_folder_ignores_itself_and_installed_code_without_source_is_trusted(tmp_path):
    assert subprocess.run(["git", "check-ignore", "-q", "proto/_generated/swarm_pb2.py"], cwd=REPO).returncode == 0
    out_dir = tmp_path / "_generated"
    shutil.copy(_codegen.PROTO_FILE, tmp_path / "swarm.proto")
    _codegen.ensure_generated(proto_file=tmp_path / "swarm.proto", out_dir=out_dir)
    (tmp_path / "swarm.proto").unlink()
    assert _codegen.is_fresh(proto_file=tmp_path / "swarm.proto", out_dir=out_dir)
