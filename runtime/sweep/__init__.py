"""`pearl sweep`: sensitivity of throughput, switching and borrowing to config keys.

keys.py   which numeric keys exist, parsing `--set`, re-validating an overridden experiment
points.py the points of a grid or one-at-a-time sweep
runner.py one point through the simulator (or the planner over the trace), a disk cache keyed
          by config hash, parallel execution with a progress bar
report.py aggregation over seeds, the throughput/switches Pareto front, markdown and plots
"""
