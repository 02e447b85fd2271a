"""Starting runs: paratrain's own training loop (builtin.py: `paratrain.train`) and a user's script
(script.py: `paratrain launch`), on this machine (local.py) or on several nodes (nodes.py).

Nothing is imported here. builtin.py imports the engine (FSDP2, DTensor: about 2 s beyond torch's
own import), which a script's launcher, the probe's readers and a sweep of scripts never use.
"""
