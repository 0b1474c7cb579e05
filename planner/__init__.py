"""Pure planning: ClusterState + predictor + policy -> Decision -> TransitionPlan. No I/O, no Ray."""
