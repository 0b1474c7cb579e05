"""Where a request goes: one routing rule for the simulator and the Ray runtime.

An engine is chosen by power-of-two choices on load (outstanding requests: two distinct
candidates, so that two engines always split evenly; drawn with replacement, half the draws
were one engine twice and a batch's first turn could land 3:1 on two engines), except that a
trajectory goes back to the engine that served its previous turn, which still holds its
prefix in cache, unless that engine is much busier than the alternative. The path rule
picks colocated or prefill->decode for a turn: with both kinds serving, a trajectory stays
on the kind that holds its prefix, and a new one follows the decided mode.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

K = TypeVar("K")

# Stay on the home engine while its load is at most STICKY_FACTOR x the alternative's +
# STICKY_SLACK: a re-prefill of a long agentic context costs more than a short queue (a guess
# tuned on the simulator's default workload, not a measurement).
STICKY_FACTOR = 2.0
STICKY_SLACK = 4.0


def pick(candidates: Sequence[K], load: Callable[[K], float], home: K | None, draw: Callable[[int], int],
         share: Callable[[K], float] | None = None) -> K | None:
    """An engine for one request; `home` must be one of `candidates` or None; `draw(n)` is uniform on [0, n).

    `share` (mixed layouts: the batch share the decision's prediction gives the engine's kind,
    `Decision.shares`) weighs the loads: an engine is compared by load / its share relative to
    the largest, and one of share 0 (a kind the prediction idles) gets nothing while another
    can serve. Equal shares route exactly as without them."""
    if not candidates:
        return None
    if share is not None:
        top = max(share(c) for c in candidates)
        if top > 0:
            candidates = [c for c in candidates if share(c) > 0]
            if home is not None and share(home) <= 0:
                home = None
            raw = load
            load = lambda c: raw(c) * top / share(c)  # noqa: E731
    if len(candidates) == 1:
        best = candidates[0]
    else:
        n = len(candidates)
        i = draw(n)
        j = (i + 1 + draw(n - 1)) % n  # uniform over the others
        x, y = candidates[i], candidates[j]
        best = x if load(x) <= load(y) else y
    if home is not None and load(home) <= STICKY_FACTOR * load(best) + STICKY_SLACK:
        return home
    return best


def path(has_colocated: bool, has_pd: bool, mode: str, home_role: str | None) -> str | None:
    """'colocated', 'pd' or None (nothing can serve the turn now)."""
    if has_colocated and has_pd:
        if home_role in ("colocated", "prefill"):
            return "colocated" if home_role == "colocated" else "pd"
        return "pd" if mode == "disaggregated" else "colocated"
    return "colocated" if has_colocated else ("pd" if has_pd else None)
