"""Where the time goes: the simulated steps' time split by cost term, for the report."""
from __future__ import annotations

import pandas as pd

#: Prefix and suffix of a term's column in the simulated step trace (``t_<term>_s``,
#: :func:`replay.core.result_columns.steps_frame`).
TERM_PREFIX, TERM_SUFFIX = "t_", "_s"


def term_time_cells(steps: pd.DataFrame) -> tuple[list[str], list[list[str]]] | None:
    """The table of the steps' time by term; None when ``steps`` has no term columns.

    Parameters
    ----------
    steps : pandas.DataFrame
        The simulated step trace: ``step_duration_s`` and the ``t_<term>_s`` columns (seconds).

    Returns
    -------
    (head, rows)
        One row per term, in column order: its seconds summed over the steps, its share of
        the steps' summed durations (percent; ``overlap`` is negative: the time compute and
        memory hide under each other) and its mean per step (ms); a row ``other`` when the
        terms miss more than 0.01 % of the durations (the KV copies of swap preemptions,
        which the engine adds to a step), and the ``all steps`` total.
    """
    terms = [c for c in steps.columns if c.startswith(TERM_PREFIX) and c.endswith(TERM_SUFFIX)]
    if not terms or not len(steps):
        return None
    total = float(steps["step_duration_s"].sum())
    n = len(steps)
    seconds = {c[len(TERM_PREFIX):-len(TERM_SUFFIX)]: float(steps[c].sum()) for c in terms}
    other = total - sum(seconds.values())
    if abs(other) > 1e-4 * abs(total):
        seconds["other"] = other
    seconds["all steps"] = total

    def share(s: float) -> str:
        return f"{100 * s / total:.1f} %" if total > 0 else "-"

    rows = [[name, f"{s:.4g}", share(s), f"{1e3 * s / n:.4g}"] for name, s in seconds.items()]
    return ["term", "seconds", "share", "ms_per_step"], rows

