"""Source clocks to seconds: time units, relative times without precision loss, resolution, epoch.

Times are converted to float64 seconds **after** subtracting the origin in the source's own
integer unit, so epoch nanoseconds (~1.7e18, beyond float64's 2**53) keep their precision.
"""
from __future__ import annotations

import numpy as np


#: Nanoseconds per unit of the ``--time-unit`` choices.
UNIT_NS: dict[str, int] = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}

#: Seconds-since-epoch above which a time column is taken to be an epoch clock (1973-03-03).
EPOCH_THRESHOLD_S = 1e8


def relative_seconds(ticks: np.ndarray, tick_ns: float, origin=None) -> np.ndarray:
    """``(ticks - origin) * tick`` as float64 seconds, subtracting in the source dtype.

    Parameters
    ----------
    ticks : ndarray of int64 or float64, shape (n,)
        Instants in units of ``tick_ns`` nanoseconds (e.g. int64 ns of a timestamp column,
        int64 ms of a Mooncake trace).
    tick_ns : float
        Nanoseconds per tick.
    origin : scalar, optional
        Default: ``ticks.min()``.

    Notes
    -----
    The subtraction happens in int64 for integer ticks, so epoch nanoseconds (beyond
    float64's 2**53) lose nothing; the difference is then converted once.
    """
    if origin is None:
        origin = ticks.min() if ticks.size else 0
    rel = (ticks - origin).astype(np.float64)
    per_s = 1e9 / tick_ns
    # dividing by an exact integer (1e3, 1e6, 1e9) rounds once; multiplying by 1e-9 would not
    return rel / per_s if per_s == int(per_s) else rel * (tick_ns / 1e9)


def time_resolution_s(rel_ticks: np.ndarray, tick_ns: int) -> float:
    """The coarsest power-of-ten of seconds (1 s ... 1 ns) that every integer offset is a multiple of.

    A ``timestamp[s]`` column read back as ``timestamp[ms]`` (BR-16) still reports 1 s.
    """
    v = np.asarray(rel_ticks, dtype=np.int64) * int(tick_ns)
    for k in range(9, -1, -1):
        if not np.any(v % (10 ** k)):
            return 10.0 ** (k - 9)
    return 1e-9


def is_epoch_seconds(seconds_min: float) -> bool:
    """Whether a column whose smallest value is ``seconds_min`` seconds is an epoch clock."""
    return bool(seconds_min > EPOCH_THRESHOLD_S)
