"""Run directories: ``schema.py`` (what a run directory holds and how to read it; the one module
analysis/ may import), ``writer.py`` (``RunDir``: writing runs, checkpoints and locks) and ``sinks.py``
(metrics trackers beside metrics.jsonl)."""
