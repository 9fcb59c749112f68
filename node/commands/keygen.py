"""`swarm-node keygen`: write a node identity (Ed25519, mode 0600) and print its peer id."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from node.service.console import console


def add_parser(sub, presets: list[str]) -> None:
    keygen = sub.add_parser("keygen", help="write a node identity (Ed25519, mode 0600) and print its peer id")
    keygen.add_argument("--out", help="key file (default $XDG_CONFIG_HOME/swarm-node/identity.key, "
                        "i.e. ~/.config/swarm-node/identity.key)")
    keygen.add_argument("--force", action="store_true", help="replace an existing key file")
    keygen.set_defaults(func=run)


def default_key_path() -> Path:
    """Under the user's config dir, never the working directory (one `git add -A` from published)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "swarm-node" / "identity.key"


def run(args: argparse.Namespace) -> int:
    from protocol import NodeIdentity  # cryptography and the wire protocol: keygen's, not every command's

    path = Path(args.out) if args.out else default_key_path()
    if path.exists() and not args.force:
        console.print(f"[red]{path} already exists[/]: it is a node identity; pass --force to replace it "
                      "(peers will see a new node).")
        return 2
    identity = NodeIdentity.generate()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    identity.save(path, overwrite=args.force)
    console.print(f"wrote {path} (mode 0600)")
    print(identity.peer_id())
    return 0
