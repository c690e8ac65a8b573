"""A what-if against the measured run: the comparison table read as baseline (measured) vs
what-if, its difference a change, not an error.

The cells are :mod:`replay.analysis.compare`'s (:func:`~replay.analysis.compare.narrow_cells`,
:func:`~replay.analysis.compare.table_cells`) under other names; the error-only columns (bias, KS,
MAPE, Wasserstein: how far a prediction is from the truth) are left out.
"""
from __future__ import annotations

import pandas as pd

from .compare import NARROW_PERCENTILES, REL_ERR_FLOOR_S, narrow_cells, table_cells
from .metrics import PERCENTILES

#: Columns of the comparison that only mean something for a prediction of the measured run.
_ERROR_ONLY = ("bias", "ks", "mape", "bias_ms", "wass_ms")


def _rename(name: str) -> str:
    for old, new in (("meas_", "base_"), ("pred_", "whatif_"), ("err_", "change_")):
        if name.startswith(old):
            return new + name[len(old):]
    return name


def whatif_head(head: list[str]) -> list[str]:
    """Column names of a measured-vs-predicted table as baseline vs what-if: ``meas_`` ->
    ``base_``, ``pred_`` -> ``whatif_``, ``err_`` -> ``change_``."""
    return [_rename(h) for h in head]


def whatif_cells(table: pd.DataFrame, wide: bool = False) -> tuple[list[str], list[list[str]]]:
    """Header and cells of a :func:`replay.analysis.compare.compare` table as baseline vs what-if:
    ``base_pXX`` (measured), ``whatif_pXX`` (predicted), ``change_pXX`` ((what-if - measured) /
    measured, or the difference in ms below 1 ms), ms; ``wide``: means and every percentile."""
    head, rows = table_cells(table, PERCENTILES) if wide else narrow_cells(table, NARROW_PERCENTILES)
    keep = [i for i, h in enumerate(head) if h not in _ERROR_ONLY]
    return whatif_head([head[i] for i in keep]), [[r[i] for i in keep] for r in rows]


def format_whatif_table(table: pd.DataFrame, differences: list[str], wide: bool = False) -> str:
    """The comparison of a what-if with the measured run as text, and what differs.

    Parameters
    ----------
    table : pandas.DataFrame
        :func:`replay.analysis.compare.compare` of the what-if's result (seconds).
    differences : list of str
        The options that differ from the measured run
        (:func:`replay.cli.baseline.whatif_differences`).
    wide : bool
        Every percentile and the means; by default p50 and p90 within 100 columns.
    """
    from ..text import WIDTH, render_table, wrap

    if table.empty:
        return "(no measured latencies to compare)"
    head, rows = whatif_cells(table, wide)
    floor = f"{REL_ERR_FLOOR_S * 1e3:g} ms"
    text = "BASELINE (measured) vs WHAT-IF\n" + render_table(head, rows, None if wide else WIDTH)
    text += "\n" + wrap(f"(a what-if, not a validation: {'; '.join(differences)}. Times in ms; change: (what-if - "
                        f"measured) / measured, or what-if - measured in ms where measured < {floor})", WIDTH)
    return text
