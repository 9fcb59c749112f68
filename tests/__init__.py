"""The test suite, in folders that say what they are (tests/codebase/test_layout.py keeps it so):

    unit/<room>/         in one process: a module or a few, real tiny nodes on the in-process bus
                         (config, ground, observe, peers, policy, protocol, scoring, testnet, train)
    integration/<room>/  whole programs: `swarm-node` processes, p2pd daemons on 127.0.0.1, the vLLM
                         engine, the deployment files run as systemd or docker would (deploy, node,
                         policy, protocol)
    experiments/         the scripts' smoke runs and the measurement labs (honest-heard, NAT)
    codebase/            house rules over the source (sizes, dependencies, generated code, this
                         layout) and the suite's own tools
    support/             helpers, imported by path: `from tests.support.waiting import wait_until`

A file sits where most of its tests belong; markers say what a folder cannot: `slow` (seconds to
minutes) and `serial` (scripts/test.sh runs these one at a time, the rest beside them at nice 19),
per test. Every folder is a package, so test modules are imported as
`tests.unit.peers.test_exchange` and may import each other by that name.
"""
