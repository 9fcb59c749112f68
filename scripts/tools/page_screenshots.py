"""Screenshots of the live pages for docs/operating.md ("The page", "The testnet page"), taken in
headless chromium (Debian's chromium and chromium-driver, which scripts/setup.sh installs):

  node-page.png     node 0 of three real `swarm-node join` processes (tiny preset, p2pd on 127.0.0.1)
                    after --node-rounds rounds: its peers and scores, curves and last rounds
  testnet-page.png  `swarm-node testnet --transport memory` with --nodes nodes, near its end

    .venv/bin/python -m scripts.tools.page_screenshots            # -> scripts/results/ (about 2 minutes)
    .venv/bin/python -m scripts.tools.page_screenshots --out /tmp/shots --node-rounds 20 --testnet-rounds 30
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from node.observe.metrics import read_metrics
from protocol.ground import stop_processes as stop
from scripts.common import ROOT, arg_parser
from scripts.tools.webdriver import MISSING, Browser

JOIN = [sys.executable, "-m", "node.cli", "join", "--preset", "tiny", "--rounds", "100000", "--quiet", "--mix", "4/4",
        "--listen", "/ip4/127.0.0.1/tcp/0", "--swarm", "screenshot", "--set", "swarm.min_round_s=0.3",
        "--set", "run.threads=1", "--set", "eval.every=5"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
DRAWN = "return +document.getElementById('chart-reward').dataset.lastRound >= arguments[0]"


def wait_for(predicate, what: str, procs: list[subprocess.Popen], timeout: float = 120.0):
    """Polls `predicate` until it returns something truthy (returned); fails at once if one of
    `procs` exits, and after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"a process exited early ({p.returncode}) while waiting for {what}")
        time.sleep(0.25)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def spawn(cmd: list[str], log: Path) -> subprocess.Popen:
    with log.open("ab") as fh:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=fh, env=ENV)


def shoot(url: str, last_round: int, path: Path) -> None:
    with Browser(width=1400, height=1050) as browser:
        browser.open(url)
        browser.wait(DRAWN.replace("arguments[0]", str(last_round)), f"round {last_round} on the page", timeout_s=60)
        browser.screenshot(path)
    print(f"wrote {path}")


def node_page(work: Path, rounds: int, path: Path) -> None:
    dirs = [work / f"node{i}" for i in range(3)]
    procs = [spawn([*JOIN, "--run-dir", str(dirs[0])], work / "node0.log")]
    try:
        wait_for(lambda: (dirs[0] / "node.json").exists(), "node 0 to listen", procs, timeout=120)
        info = json.loads((dirs[0] / "node.json").read_text())
        procs += [spawn([*JOIN, "--run-dir", str(d), "--peers", *info["listen_addrs"]], work / f"{d.name}.log")
                  for d in dirs[1:]]
        wait_for(lambda: len(read_metrics(dirs[0])) >= rounds, f"{rounds} rounds on node 0", procs, timeout=60 + rounds)
        shoot(f"http://{info['metrics']}/", rounds - 1, path)
    finally:
        stop(procs)


def testnet_page(work: Path, nodes: int, rounds: int, path: Path) -> None:
    log = work / "testnet.log"
    procs = [spawn([sys.executable, "-m", "node.cli", "testnet", "--transport", "memory", "--nodes", str(nodes),
                    "--rounds", str(rounds), "--quiet", "--set", "eval.every=10", "--out", str(work / "testnet")], log)]
    try:
        def url() -> str | None:
            found = re.search(r"live testnet page on (http://\S+/)", log.read_text())
            return found and found.group(1)

        wait_for(url, "the testnet page", procs, timeout=60)
        node0 = work / "testnet" / "mix4-4-seed0" / "node0"
        near_end = rounds - max(2, rounds // 20)
        wait_for(lambda: len(read_metrics(node0)) >= near_end, f"{near_end} rounds", procs, timeout=60 + 2 * rounds)
        shoot(url(), near_end - 1, path)
    finally:
        stop(procs)


def main() -> int:
    parser = arg_parser(__spec__, __doc__)
    parser.add_argument("--out", default=str(ROOT / "scripts" / "results"))
    parser.add_argument("--node-rounds", type=int, default=80)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--testnet-rounds", type=int, default=200)
    args = parser.parse_args()
    if MISSING:
        print(MISSING, file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="page-screenshots-") as work:
        node_page(Path(work), args.node_rounds, out / "node-page.png")
        testnet_page(Path(work), args.nodes, args.testnet_rounds, out / "testnet-page.png")
    print(f"done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
