"""The bottom layer, imported by every other: ``errors.py`` (HarnessError and its kinds) and
``registry.py`` (the Registry every plug-in kind uses, and the plugin loader; algorithms/ and
rewards/ may import it, and nothing else of the harness)."""
