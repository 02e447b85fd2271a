"""`paratrain sweep`: inter-model parallelism, several trials of a hyperparameter search at once.

    space.py     the Comet-format search space and its mapping to Optuna distributions
    client.py    what a trial script calls: `paratrain.report(name=value, step=...)`
    trial.py     one trial: its process, cores, environment, metrics and outcome
    driver.py    the study: storage, claiming work, N trials at once, resume, results

This package stays import-light (a trial script imports `paratrain.report` from here).
"""
