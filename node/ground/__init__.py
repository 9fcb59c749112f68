"""The ground floor: plumbing of the standard library only, which every package of the repository
may import, node/'s rooms and policy/ and protocol/ alike (tests/test_dependency_rule.py names it).

    files         atomic writes with one failure rule (identity key, peer cache, node.json, LATEST)
    parent_death  die_with_parent: a child process (p2pd, vLLM server, scorer worker) dies with the node
    child_env     the environment of a child `python -m ...` of this repository, and stopping children

Why here: the top level is node/ policy/ protocol/ proto/ (plus tests/ and scripts/); proto/ is the
wire format, and importing it builds the generated code and loads protobuf; protocol/'s package
imports cryptography and the transports; so the ground lives in a package whose __init__ imports
nothing. node/ is that package (so is policy/, but the ground is the node's plumbing: its files,
its children), and its rule stays simple: policy/ and protocol/ import node.ground and nothing else
of node/. The ground imports only the standard library, never another package of this repository
(tests/test_dependency_rule.py checks the source, tests/test_files.py what an import loads)."""
