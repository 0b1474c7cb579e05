"""`pearl train --plot`: a run's reward curve and rollout throughput, one point per training step."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_steps(steps: list[dict[str, Any]], path: Path, title: str) -> None:
    """Mean reward (left axis) and generated tokens per second (right axis) per step; the
    marker says in which rollout mode the batch ran, so a layout change shows on the curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = [s["step"] for s in steps]
    ax.plot(x, [s["mean_reward"] for s in steps], color="tab:blue", lw=1.5, label="mean reward")
    for mode, marker in (("colocated", "o"), ("disaggregated", "s")):
        pts = [(s["step"], s["mean_reward"]) for s in steps if s["mode"] == mode]
        if pts:
            ax.scatter(*zip(*pts), color="tab:blue", marker=marker, s=18, label=f"{mode} batch", zorder=3)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward", color="tab:blue")
    tput = ax.twinx()
    tput.plot(x, [s["tok_per_s"] for s in steps], color="tab:orange", lw=1, ls="--", label="rollout tokens/s")
    tput.set_ylabel("generated tokens / s", color="tab:orange")
    lines = ax.get_legend_handles_labels()
    more = tput.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
