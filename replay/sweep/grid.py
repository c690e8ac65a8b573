"""The grid of a sweep: ``--sweep NAME=VALUES`` parsed and checked, and its points."""
from __future__ import annotations

import itertools
from decimal import Decimal, InvalidOperation

from ..errors import ConfigError
from ..schedulers import check_scheduler_names

#: Sweepable options (their ``replay`` names) and the type of their values. ``rate-scale``
#: divides the trace's arrival times (2 = twice the load); the others are
#: :class:`~replay.config.ReplayConfig` options (:meth:`~replay.config.ReplayConfig.with_options`).
PARAMS = {
    "rate-scale": float,
    "scheduler": str,
    "max-num-seqs": int,
    "max-num-batched-tokens": int,
    "replicas": int,
    "concurrency": int,
}
#: Most points one sweep may have (a guard against a mistyped range).
MAX_POINTS = 10_000
def column(name: str) -> str:
    """The table column of a swept option: ``rate-scale`` -> ``rate_scale``."""
    return name.replace("-", "_")


def parse_sweep(text: str) -> tuple[str, list]:
    """One ``--sweep`` value: ``NAME=a,b,c`` (a list) or ``NAME=start:stop:step`` (a range).

    A range holds ``start, start + step, ...`` up to ``stop``, which is included when it
    lands on the grid; it is computed in decimal, so ``0.5:3:0.25`` gives exactly
    0.5, 0.75, ..., 3.0.

    Returns
    -------
    (name, values)
        ``name`` a key of :data:`PARAMS`; ``values`` of its type, in the order given.

    Raises
    ------
    ConfigError
        Unknown name, malformed or empty values, a repeated value, a number out of range
        (rates > 0, counts >= 1), a range over schedulers, a scheduler that cannot be loaded.
    """
    name, sep, spec = (part.strip() for part in text.partition("="))
    if name not in PARAMS:
        raise ConfigError(f"--sweep {text}: unknown option {name!r}; sweepable: {', '.join(PARAMS)}")
    kind = PARAMS[name]
    if not sep or not spec:
        raise ConfigError(f"--sweep {text}: give values, e.g. {name}=a,b,c or {name}=start:stop:step")
    if ":" in spec and kind is not str:
        values = _range(name, spec, kind)
    else:
        values = [_value(name, v.strip(), kind) for v in spec.split(",") if v.strip()]
        if not values:
            raise ConfigError(f"--sweep {text}: no values")
    if kind is str:
        check_scheduler_names(values, f"--sweep {name}")
    else:
        repeated = sorted({str(v) for v in values if values.count(v) > 1})
        if repeated:
            raise ConfigError(f"--sweep {name}: {', '.join(repeated)} given more than once")
    return name, values


def _value(name: str, text: str, kind):
    if kind is str:
        return text
    try:
        v = Decimal(text)
    except InvalidOperation:
        raise ConfigError(f"--sweep {name}: {text!r} is not a number") from None
    return _checked(name, v, kind)


def _checked(name: str, v: Decimal, kind):
    if not v.is_finite() or (v <= 0 if kind is float else v < 1):
        raise ConfigError(f"--sweep {name}: {v} is out of range (must be {'> 0' if kind is float else '>= 1'})")
    if kind is int:
        if v != v.to_integral_value():
            raise ConfigError(f"--sweep {name}: {v} is not an integer")
        return int(v)
    return float(v)


def _range(name: str, spec: str, kind) -> list:
    parts = spec.split(":")
    try:
        start, stop, step = (Decimal(p.strip()) for p in parts) if len(parts) == 3 else (None,) * 3
    except InvalidOperation:
        start = None
    if start is None or not all(x.is_finite() for x in (start, stop, step)):
        raise ConfigError(f"--sweep {name}={spec}: expected start:stop:step, e.g. {name}=1:4:1")
    if step <= 0 or stop < start:
        raise ConfigError(f"--sweep {name}={spec}: needs step > 0 and stop >= start")
    n = int((stop - start) // step) + 1
    if n > MAX_POINTS:
        raise ConfigError(f"--sweep {name}={spec}: {n} values; at most {MAX_POINTS}")
    return [_checked(name, start + i * step, kind) for i in range(n)]


def parse_sweeps(texts) -> dict[str, list]:
    """Every ``--sweep`` option: ``{name: values}`` in the order given (the table's order).

    Raises
    ------
    ConfigError
        See :func:`parse_sweep`; an option swept twice; more than :data:`MAX_POINTS` points.
    """
    sweeps: dict[str, list] = {}
    for text in texts:
        name, values = parse_sweep(text)
        if name in sweeps:
            raise ConfigError(f"--sweep {name}: given twice; list all its values in one --sweep")
        sweeps[name] = values
    n = 1
    for values in sweeps.values():
        n *= len(values)
    if n > MAX_POINTS:
        raise ConfigError(f"--sweep: {n} points; at most {MAX_POINTS}")
    return sweeps


def sweep_points(sweeps: dict[str, list]) -> list[dict]:
    """The cartesian product of ``sweeps`` as ``{name: value}`` dicts, the last option varying fastest."""
    names = list(sweeps)
    return [dict(zip(names, combo)) for combo in itertools.product(*sweeps.values())]
