"""The RL loop: policy versions and their spans, weight syncs, engine states (paused,
asleep), operations on endpoints and the route probe."""
