"""The node's configuration room: the typed schema (schema.py), the [swarm] section and its nested
sections (swarm.py), its presets (presets.py), the feature sections it holds (sections.py) and the
environment-file writer (env_file.py). Pure data, torch-free, importing no feature module: the
runtime builds its objects from the sections (`X.from_config(section)`), never the config, so
`swarm-node config` and a bad config answer in a fraction of a second."""
