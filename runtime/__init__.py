"""Imperative shell: CLI, simulator, Ray runtime. Depends on planner and models."""
