"""placeholder: filled by the profiling work."""
