"""Benchmarks: gossip/ (the transports, process per node), policy/ (our policy stack against TRL and
plain generate), round_cost (a sharing round against a silo round), sender_lockout (the replay
guard's sender tables under many keys)."""
