"""How much CPU time the hypervisor gave other guests: /proc/stat's steal.

Why: on a shared VM the engines' speed follows the host's contention (README: the validation
errors rose with steal in both modes), so every measurement that becomes a profile or judges
one records the steal it ran under, and a calibration refuses a contended host."""

from __future__ import annotations


def cpu_times() -> tuple[float, float]:
    """(steal, total) jiffies of this machine's CPUs (/proc/stat; zeros where there is none)."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    return (fields[7] if len(fields) > 7 else 0.0), sum(fields[:8])


def steal_pct(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """Share of CPU time stolen by the hypervisor between two `cpu_times` readings, in % (None: no time passed, or no /proc/stat)."""
    total = after[1] - before[1]
    return round((after[0] - before[0]) / total * 100, 2) if total > 0 else None
