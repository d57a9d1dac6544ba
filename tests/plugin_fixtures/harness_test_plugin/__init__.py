"""A test-only plugin package: registers ``test_plugin_algo`` from outside ``algorithms/``."""
