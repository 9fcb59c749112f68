"""The live pages in a real headless browser (Debian's chromium through chromedriver): the page of a
`join` node and the page of an in-process memory testnet draw the curves from the nodes' own values
(each chart canvas carries what it plotted in data-* attributes; /api/state has the values), and
the lines are really on the canvas. Screenshots go to the test's tmp dir."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.observe.metrics import read_metrics
from scripts.tools.webdriver import MISSING, Browser
from tests.unit.observe.test_observe import get
from tests.integration.node.test_observe_live import ARGS
from tests.integration.node.test_swarm_join import start
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

CHART = """const c = document.getElementById(arguments[0]);
return {series: +c.dataset.series, points: +c.dataset.points, last: c.dataset.last === "" ? null : +c.dataset.last,
        lastRound: c.dataset.lastRound === "" ? null : +c.dataset.lastRound};"""
# pixels of the first line colour (#2563eb) on a canvas: the curve was really drawn
INK = """const c = document.getElementById(arguments[0]);
const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
let n = 0;
for (let i = 0; i < d.length; i += 4)
  if (Math.abs(d[i] - 37) < 40 && Math.abs(d[i + 1] - 99) < 40 && d[i + 2] > 190) n++;
return n;"""


def assert_drawn_from(browser: Browser, canvas: str, *curves: list[list[float]]) -> dict:
    """The chart plotted `curves` up to the round it last saw (the node may have moved on since);
    its last value is the first curve's."""
    chart = browser.run(CHART, canvas)
    seen = [[p for p in curve if p[0] <= chart["lastRound"]] for curve in curves]
    assert chart["series"] == len(curves) and chart["points"] == sum(map(len, seen)), (chart, len(curves[0]))
    assert chart["last"] == pytest.approx(seen[0][-1][1]), (chart, seen[0][-3:])
    assert browser.run(INK, canvas) > 100
    return chart


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 30_000


def test_node_page_draws_the_nodes_curves_live(tmp_path, processes):
    a = tmp_path / "a"
    procs = [start(processes, a, args=[*ARGS, "--rounds", "5000"])]
    wait_until(lambda: len(read_metrics(a)) >= 10, "10 rounds", procs=procs, timeout=120, step=0.25)
    info = json.loads((a / "node.json").read_text())
    url = f"http://{info['metrics']}/"
    with Browser() as browser:
        browser.open(url)
        browser.wait("return +document.getElementById('chart-reward').dataset.points >= 10", "the reward curve")
        first = browser.run(CHART, "chart-reward")
        # live: the page redraws from new rounds without reloading
        browser.wait(f"return +document.getElementById('chart-reward').dataset.lastRound > {first['lastRound']}",
                     "a redraw with newer rounds")
        state = json.loads(get(url + "api/state")[1])
        assert_drawn_from(browser, "chart-reward", state["curves"]["reward"])
        heldout = assert_drawn_from(browser, "chart-heldout", state["curves"]["heldout_pass1"],
                                    state["curves"]["heldout_passk"])
        assert heldout["points"] >= 8  # pass@1 and pass@k, every 2nd round
        facts = browser.run("return document.getElementById('facts').textContent")
        assert info["peer_id"] in facts and "transport p2pd" in facts
        newest = browser.run("return document.querySelector('#right-table tr:nth-child(2) td').textContent")
        assert int(newest) == browser.run(CHART, "chart-reward")["lastRound"]
        assert_png(browser.screenshot(tmp_path / "node-page.png"))


def test_testnet_page_draws_one_line_per_node(tmp_path):
    from node.observe.server import ObserveServer
    from node.observe.testnet import TestnetPage
    from node.observe.web import page_routes
    from node.testnet.dashboard import Dashboard
    from node.testnet.memory import MemoryTestnet
    from node.testnet.plan import Plan

    plan = Plan(nodes=3, rounds=12, transport="memory", out=tmp_path, overrides=["eval.every=4"])
    page = TestnetPage()
    run_dir = tmp_path / "run"
    page.begin_run("testnet under test", run_dir, [run_dir / f"node{i}" for i in range(3)])
    MemoryTestnet(plan, (4, 4), 0, run_dir, Dashboard("t", quiet=True, page=page)).run()
    server = ObserveServer("127.0.0.1:0", page_routes(page.state)).start()
    try:
        with Browser() as browser:
            browser.open(server.url)
            browser.wait("return +document.body.dataset.updates >= 1", "the first update")
            reward = browser.run(CHART, "chart-reward")
            heldout = browser.run(CHART, "chart-heldout")
            assert (reward["series"], reward["points"]) == (3, 36) and (heldout["series"], heldout["points"]) == (3, 9)
            state = json.loads(get(server.url + "api/state")[1])
            assert reward["last"] == pytest.approx(state["nodes"][0]["curves"]["reward"][-1][1])
            assert browser.run(INK, "chart-reward") > 100
            names = browser.run("return [...document.querySelectorAll('#left-table td:first-child')]"
                                ".map(td => td.textContent)")
            assert names == ["node0", "node1", "node2"]
            assert_png(browser.screenshot(tmp_path / "testnet-page.png"))
    finally:
        server.stop()
