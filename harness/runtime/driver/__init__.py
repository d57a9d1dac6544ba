"""The driver side: ``HybridEngine`` (the loop's handle on the workers), the rollout pipeline, multi-turn episodes."""
