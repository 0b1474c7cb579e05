"""Physics of rollout: step latency, batch completion, transition costs, training time."""
