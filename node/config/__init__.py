"""The node's configuration room: the typed schema (schema.py), its presets (presets.py), the feature
sections it holds (sections.py) and the environment-file writer (env_file.py). Torch-free and
importing no feature module, so `swarm-node config` and a bad config answer in a fraction of a second."""
