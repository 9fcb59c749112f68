"""The gossip benchmark and its neighbours. bench: the driver (`python -m scripts.bench.gossip.bench`);
node: one protocol-only node process; swarm: starting and talking to N of them; phases: the measured
phases of one run; conns: connection figures and settling; report: tables, ratios and the plot.
flood: honest delivery under a flood through p2pd daemons; sim_scale: the bounded overlay modelled
at sizes one machine cannot start."""
