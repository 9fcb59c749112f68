"""node/'s ground floor: plumbing of the standard library only, which every room of node/ may import
(tests/codebase/test_dependency_rule.py names it).

    files         atomic writes with one failure rule (node.json, metrics rewrites, LATEST)
    parent_death  die_with_parent: a child process (scorer worker) dies with the node
    child_env     the environment of a child `python -m ...` of this repository, and stopping children

policy/ and protocol/ import no package of node/ (nor each other), so each keeps the same plumbing
beside it with the same rules: policy/ground.py (the vLLM server's child, LATEST) and
protocol/ground.py (the identity key, the peer cache, the p2pd daemon). This package's __init__
imports nothing, so importing node.ground loads nothing else of node/."""
