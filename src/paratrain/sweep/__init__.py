"""`paratrain sweep`: inter-model parallelism, several trials of a hyperparameter search at once.

    space.py     the Comet-format search space and its mapping to Optuna distributions
    trial.py     one trial: its process, cores, environment, metrics and outcome
    driver.py    the study: storage, claiming work, N trials at once, resume, results

What a trial script calls, `paratrain.report(name=value, step=...)`, is paratrain/script_client.py:
`paratrain launch` reads the same reports.
"""
