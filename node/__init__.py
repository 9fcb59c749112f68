"""The node: tasks and verifiers, the round loop, config, CLI, metrics, reports."""
