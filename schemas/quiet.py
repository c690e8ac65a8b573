"""Numerical RuntimeWarnings hidden from the commands' output, in this process and its workers.

numpy's and the fitting libraries' warnings (``invalid value encountered in divide``, ``Mean
of empty slice``, ...) only repeat an arithmetic detail: the data rules are checked by
validation, which names the file and row. The console entry (:mod:`traces.console`) and the
fits' worker pools (:mod:`replay.parallel`) call :func:`quiet_warnings`; it imports nothing
heavy (the console calls it before the command's package is imported).
"""
from __future__ import annotations

import os

#: Start of the messages of numpy's floating-point and NaN-aware warnings (all RuntimeWarning).
QUIET_RUNTIME_WARNINGS = (
    "invalid value encountered", "divide by zero encountered", "overflow encountered", "underflow encountered",
    "Mean of empty slice", "Degrees of freedom <= 0", "All-NaN slice encountered", "All-NaN axis encountered",
    "invalid value", "Precision loss occurred", "The iteration is not making good progress",
    "Covariance of the parameters could not be estimated",
)
#: Modules whose RuntimeWarnings are numerical chatter, whatever the message.
QUIET_MODULES = r"(numpy|scipy|lmfit|pandas|uncertainties|asteval)(\.|$)"


def quiet_warnings() -> None:
    """Hide numerical RuntimeWarnings in this process and in the processes it starts."""
    import warnings

    for msg in QUIET_RUNTIME_WARNINGS:
        warnings.filterwarnings("ignore", message=msg, category=RuntimeWarning)
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=QUIET_MODULES)
    # -W syntax: action:message-prefix:category (spawned workers start from the environment)
    extra = ",".join(f"ignore:{m}:RuntimeWarning" for m in QUIET_RUNTIME_WARNINGS if "," not in m and ":" not in m)
    prev = os.environ.get("PYTHONWARNINGS")
    if not prev or extra not in prev:
        os.environ["PYTHONWARNINGS"] = f"{prev},{extra}" if prev else extra
