"""A `configs/workloads/*.yaml` file as `pearl calibrate` writes it: a header saying where it
came from, then the spec in reading order (batch, distributions one per line, budget, cache hit).
`models.config` loads it back like any hand-written workload."""

from __future__ import annotations

import yaml

from models.config import WorkloadSpec

DIST_FIELDS = ("turns", "initial_prompt_tokens", "new_tokens_per_turn", "response_tokens_per_turn", "env_latency_s")


def render_workload(header: list[str], w: WorkloadSpec) -> str:
    """The header lines (each a `# ` comment), then the workload's fields."""
    data = w.model_dump(exclude_none=True)
    plain = {k: v for k, v in data.items() if k not in DIST_FIELDS}
    body = yaml.safe_dump({k: plain[k] for k in ("trajectories_per_batch", "group_size")}, sort_keys=False)
    body += yaml.safe_dump({k: data[k] for k in DIST_FIELDS}, sort_keys=False, default_flow_style=None, width=200)
    body += yaml.safe_dump({k: plain[k] for k in ("max_trajectory_tokens", "prefix_cache_hit")}, sort_keys=False)
    return "\n".join(header) + "\n" + body
