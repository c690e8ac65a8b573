"""A sweep's table: printed in fixed-width text, written as Parquet or CSV."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import ConfigError
from ..analysis.metrics import PERCENTILES
from .grid import column

#: Metrics of the printed table (the file also has ``queue_wait``).
TABLE_METRICS = ("ttft", "tpot", "e2e")
#: The percentile whose cells show their band in the default table (``--wide``: every cell).
BAND_PERCENTILE = 90
#: Formats ``--sweep-out`` can write, by file suffix.
OUTPUT_FORMATS = (".parquet", ".csv")


# -- output ----------------------------------------------------------------------------------------

def format_sweep_table(table: pd.DataFrame, swept: list[str], percentiles=PERCENTILES, wide: bool = False) -> str:
    """A :func:`run_sweep` table as text: the swept values, then milliseconds and requests/s.

    Parameters
    ----------
    swept : list[str]
        The swept options (keys of :data:`replay.sweep.grid.PARAMS`), in column order.
    wide : bool
        Every column (p50, p90, p99 of each metric, ``_ms`` and ``_rps`` in the names).
        By default p50 and p90 of each metric, goodput and throughput, within
        :data:`replay.text.WIDTH` (100) characters a line (when many options are swept,
        E2E p90, n_ok, E2E p50, TPOT p90 and TTFT p90 are left out, in that order, until
        the table fits).

    A table with bands (``{stat}_low``/``{stat}_high``, :func:`replay.analysis.band_tables.band_columns`)
    shows each p90 cell as ``"point [low, high]"``; ``wide``: every time and rate cell.
    """
    from ..analysis.band_tables import row_band
    from ..analysis.compare import NARROW_PERCENTILES, ms_cell
    from ..text import WIDTH, render_table

    if table.empty:
        return "(no points)"
    cols = [column(n) for n in swept]
    qs = list(percentiles) if wide else ([q for q in NARROW_PERCENTILES if q in percentiles] or list(percentiles)[:2])
    stats = [(m, q) for m in TABLE_METRICS for q in qs]
    rates = [c for c in ("goodput_rps", "throughput_rps") if c in table]
    if wide:
        head = cols + ["n_ok"] + [f"{m}_p{q}_ms" for m, q in stats] + rates
    else:
        head = cols + ["n_ok"] + [f"{m}_p{q}" for m, q in stats] + [c.removesuffix("_rps") for c in rates]
    def ms(x):
        return f"{x * 1e3:.1f}" if wide else ms_cell(x)

    lines = []
    for r in table.to_dict("records"):  # keeps each column's type (iterrows would make ints floats)
        band = row_band(r)
        cells = [f"{r[c]:g}" if isinstance(r[c], float) else str(r[c]) for c in cols] + [str(r["n_ok"])]
        cells += [band.cell(f"{m}_p{q}_s", fmt=ms) if wide or q == BAND_PERCENTILE else ms(r[f"{m}_p{q}_s"])
                  for m, q in stats]
        cells += [band.cell(c, fmt=lambda x: f"{x:.3f}") if wide else f"{r[c]:.3f}" for c in rates]
        lines.append(cells)
    if wide:
        return render_table(head, lines)
    drop = ("e2e_p90", "n_ok", "e2e_p50", "tpot_p90", "ttft_p90")
    return render_table(head, lines, WIDTH, drop_order=drop)


def check_output_path(path: str, option: str = "--sweep-out") -> None:
    """Raise a ConfigError naming ``option`` unless ``path`` ends in a format of :data:`OUTPUT_FORMATS`."""
    if Path(path).suffix.lower() not in OUTPUT_FORMATS:
        raise ConfigError(f"{option} {path}: give a .parquet or .csv file")


def write_sweep_table(table: pd.DataFrame, path: str, option: str = "--sweep-out") -> None:
    """Write a sweep table as Parquet or CSV (by suffix), atomically (seconds, requests/s);
    ``option`` names the path in the error of a bad suffix."""
    from schemas.atomic import atomic_output

    check_output_path(path, option)
    with atomic_output(path) as tmp:
        if Path(path).suffix.lower() == ".csv":
            table.to_csv(tmp, index=False)
        else:
            table.to_parquet(tmp, index=False)
