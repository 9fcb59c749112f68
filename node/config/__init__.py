"""The node's configuration room: the typed schema (schema.py), the [swarm] section and its nested
sections (swarm.py), its presets (presets.py), the feature sections it holds (sections.py) and the
environment-file writer (env_file.py). Torch-free and importing no feature module at load time
(swarm.py's `to_options` import their option types when called), so `swarm-node config` and a bad
config answer in a fraction of a second."""
