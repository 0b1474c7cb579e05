"""Aggregate sweep records over seeds, find the throughput/switches Pareto front, write table and plots.

Bands in the plots and `±` in the table are mean ± one standard deviation across seeds
(sample std, ddof = 1; 0 with one seed); min and max are kept in the JSON as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

BAND = "mean ± 1 std across seeds"


def aggregate(records: list[dict[str, Any]], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """One entry per point: its values and, per metric, mean / std / min / max over the seeds."""
    by: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault(r["point"], []).append(r)
    out = []
    for i in sorted(by):
        rs = by[i]
        entry: dict[str, Any] = {"point": i, "values": rs[0]["values"], "varied": rs[0]["varied"], "seeds": [r["seed"] for r in rs]}
        for m in metrics:
            xs = np.array([float(r[m]) for r in rs if r.get(m) is not None])
            if xs.size == 0:
                continue
            std = float(np.std(xs, ddof=1)) if xs.size > 1 else 0.0
            entry[m] = {"mean": float(np.mean(xs)), "std": std, "min": float(np.min(xs)), "max": float(np.max(xs))}
        out.append(entry)
    return out


def pareto_front(cost: Sequence[float], gain: Sequence[float]) -> list[int]:
    """Indices of the points no other point dominates (cost <= and gain >=, one strictly), by increasing cost.

    Here cost = switches (fewer is better) and gain = throughput (more is better). Identical
    points do not dominate each other, so both stay on the front.
    """
    c = np.asarray(cost, dtype=float)
    g = np.asarray(gain, dtype=float)
    if c.shape != g.shape:
        raise ValueError("cost and gain need the same length")
    front = []
    for i in range(c.size):
        dominated = np.any((c <= c[i]) & (g >= g[i]) & ((c < c[i]) | (g > g[i])))
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (c[i], -g[i]))


def mark_front(agg: list[dict[str, Any]], cost: str, gain: str) -> list[int]:
    """Flag each aggregated point `pareto: bool` on the (mean cost, mean gain) front; return the front's indices."""
    usable = [a for a in agg if cost in a and gain in a]
    idx = pareto_front([a[cost]["mean"] for a in usable], [a[gain]["mean"] for a in usable])
    on = {usable[i]["point"] for i in idx}
    for a in agg:
        a["pareto"] = a["point"] in on
    return [usable[i]["point"] for i in idx]


def failure_lines(records: list[dict[str, Any]]) -> list[str]:
    """One stderr warning per simulated run whose policy failed decisions (records without the counters are skipped)."""
    from runtime.sim.metrics import failure_warning

    lines = []
    for r in records:
        if r.get("policy_failures"):
            at = ", ".join(f"{k.split('.')[-1]}={_value(v)}" for k, v in r["values"].items())
            who = f"policy {r['policy']} at {at or 'the config'} seed {r['seed']}"
            lines.append(failure_warning(who, r["policy_failures"], r["decisions"], r["starts"], r.get("failure")))
    return lines


def any_failed_all(records: list[dict[str, Any]]) -> bool:
    """True if some run's policy never got a layout running (its throughput is no result)."""
    from runtime.sim.metrics import failed_every_decision

    return any(failed_every_decision(r["policy_failures"], r["decisions"], r["starts"]) for r in records if r.get("policy_failures"))


def fmt(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.1f}"
    return f"{x:.3g}"


def _cell(entry: dict[str, Any], m: str) -> str:
    s = entry.get(m)
    if s is None:
        return "-"
    if len(entry["seeds"]) > 1:
        return f"{fmt(s['mean'])} ± {fmt(s['std'])}"
    return fmt(s["mean"])


def _value(v: Any) -> str:
    return "(config)" if v is None else fmt(float(v)) if isinstance(v, (int, float)) else str(v)


def markdown_table(agg: list[dict[str, Any]], keys: Sequence[str], metrics: Sequence[str], labels: dict[str, str] | None = None) -> str:
    """A markdown table: swept values, seeds, each metric (mean ± std with several seeds), Pareto flag."""
    labels = labels or {}
    head = [*keys, "seeds", *(labels.get(m, m) for m in metrics), "Pareto"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
    for a in agg:
        row = [_value(a["values"].get(k)) + ("*" if a.get("varied") == k else "") for k in keys]
        row += [str(len(a["seeds"])), *(_cell(a, m) for m in metrics), "yes" if a.get("pareto") else ""]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _lines_for(agg: list[dict[str, Any]], key: str, keys: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """The curves of `metric vs key`: one-way points that vary `key`, or grid points grouped by the other keys."""
    others = [k for k in keys if k != key]
    groups: dict[str, list[dict[str, Any]]] = {}
    for a in agg:
        if a.get("varied") is not None:
            if a["varied"] != key:
                continue
            label = "others at config values"
        else:
            label = ", ".join(f"{k.split('.')[-1]}={_value(a['values'][k])}" for k in others) or key
        groups.setdefault(label, []).append(a)
    for g in groups.values():
        g.sort(key=lambda a: float(a["values"][key]))
    return groups


def _scale(ax: Any, xs: list[float]) -> None:
    pos = [x for x in xs if x > 0]
    if len(pos) >= 2 and max(pos) / min(pos) >= 50:
        ax.set_xscale("symlog", linthresh=min(pos))


def plot_sweep(agg: list[dict[str, Any]], keys: Sequence[str], path: Path, title: str, gain: str, rows: Sequence[str],
               cost: str, labels: dict[str, str] | None = None) -> Path:
    """Per swept key a column of `metric vs key` panels (rows), plus the gain/cost Pareto panel; PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = labels or {}
    nrow, ncol = len(rows), len(keys) + 1
    fig = plt.figure(figsize=(4.2 * ncol, 2.8 * nrow + 0.6))
    grid = fig.add_gridspec(nrow, ncol)
    seeds = max(len(a["seeds"]) for a in agg)
    for j, key in enumerate(keys):
        lines = _lines_for(agg, key, keys)
        for i, m in enumerate(rows):
            ax = fig.add_subplot(grid[i, j])
            for n, (label, pts) in enumerate(lines.items()):
                pts = [a for a in pts if m in a]
                if not pts:
                    continue
                xs = [float(a["values"][key]) for a in pts]
                mean = np.array([a[m]["mean"] for a in pts])
                std = np.array([a[m]["std"] for a in pts])
                ax.plot(xs, mean, marker="o", ms=3, label=label if n < 8 else None)
                if seeds > 1:
                    ax.fill_between(xs, mean - std, mean + std, alpha=0.2)
                _scale(ax, xs)
            if i == nrow - 1:
                ax.set_xlabel(key)
            if j == 0:
                ax.set_ylabel(labels.get(m, m))
            ax.grid(alpha=0.3)
            if i == 0 and len(lines) > 1:
                ax.legend(fontsize=6)
    ax = fig.add_subplot(grid[:, -1])
    usable = [a for a in agg if cost in a and gain in a]
    cx = np.array([a[cost]["mean"] for a in usable])
    gy = np.array([a[gain]["mean"] for a in usable])
    ax.errorbar(cx, gy, xerr=[a[cost]["std"] for a in usable], yerr=[a[gain]["std"] for a in usable], fmt="o", color="0.6", ms=4,
                elinewidth=0.8, label="points")
    front = pareto_front(cx, gy)
    ax.step(cx[front], gy[front], where="post", color="tab:red", marker="o", ms=5, label="Pareto front")
    labelled: set[tuple[float, float]] = set()
    for i in front:
        a = usable[i]
        if (cx[i], gy[i]) in labelled:  # the same configuration met again (one-way sweeps repeat the config's values)
            continue
        labelled.add((cx[i], gy[i]))
        txt = ", ".join(f"{k.split('.')[-1]}={_value(v)}" for k, v in a["values"].items() if a.get("varied") in (None, k))
        ax.annotate(txt, (cx[i], gy[i]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(f"{labels.get(cost, cost)} (fewer is better)")
    ax.set_ylabel(f"{labels.get(gain, gain)} (more is better)")
    ax.set_title("Pareto front", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    band = f"bands/bars: {BAND} ({seeds} seeds)" if seeds > 1 else "1 seed per point: no band"
    fig.suptitle(f"{title}\n{band}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
