"""The engine: what runs inside one rank (the training loop, the strategies, data, timing, memory).

A regular package rather than a namespace one, so that the import-linter contract in
pyproject.toml can place it as one layer: the engine may use workloads, config and the run
directory, and nothing that launches or analyses runs.
"""
