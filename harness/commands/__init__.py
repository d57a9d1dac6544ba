"""The ``harness`` command and its subcommands: the top layer, the only one that imports analysis/.

* ``cli.py``: ``harness`` (run, sweep, report, eval, serve, plan, rm, data, list, ...).
* ``evaluate.py``, ``eval_sweep.py``: ``harness eval`` of one model or of a sweep's runs.
* ``serve.py``: ``harness serve``, a rollout server.
* ``plan.py``: ``harness plan``, the memory a run needs per process.
* ``presets.py``: the shipped sweep presets (sweeps/*.yaml).
* ``docs_gen.py``: the generated parts of the docs.
"""
