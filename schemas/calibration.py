"""The calibration file: a versioned JSON that ``calibrate`` writes and ``replay`` reads."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SchemaError
from .specs import GpuSpec, ModelSpec
from .tables import write_text_atomic

CALIBRATION = "calibration/1"
#: Cost-model parameters a calibration carries, in natural units.
PARAM_NAMES = ("eta_compute", "eta_mem", "t_launch_s", "t_cpu_s")


@dataclass
class FittedParam:
    """One fitted parameter.

    Attributes
    ----------
    value : float
        Best estimate (natural units: efficiencies are fractions, times seconds).
    stderr : float | None
        Standard error; None when the data cannot identify the parameter.
    identifiable : bool
        False when the data do not pin the parameter down (then ``bound`` says what is known).
    bound : str | None
        E.g. ``">= 0.41"`` when only a bound is known.
    vary : bool
        False when the parameter was held fixed.
    ci95 : tuple[float, float] | None
        95 % confidence interval when computed.
    """

    value: float
    stderr: float | None = None
    identifiable: bool = True
    bound: str | None = None
    vary: bool = True
    ci95: tuple | None = None


@dataclass
class Calibration:
    """A fitted cost model with its provenance.

    Attributes
    ----------
    model : ModelSpec
    gpu : GpuSpec
    tp : int
    form : str
        ``"max"`` or ``"sum"`` roofline.
    params : dict[str, FittedParam]
        Keyed by :data:`PARAM_NAMES`.
    fit : dict
        Statistics: method, n_rows, r2, residual percentiles, correlations, per-form results.
    source : dict
        ``path``, ``sha256`` and ``kind`` of the trace it was fitted on.
    """

    model: ModelSpec
    gpu: GpuSpec
    tp: int
    form: str
    params: dict
    fit: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)

    def value(self, name: str) -> float:
        """The fitted value of parameter ``name``."""
        return self.params[name].value

    def to_dict(self) -> dict:
        return {
            "servecal.schema": CALIBRATION,
            "model": self.model.to_dict(),
            "gpu": self.gpu.to_dict(),
            "tp": self.tp,
            "form": self.form,
            "params": {k: {**vars(p), "ci95": list(p.ci95) if p.ci95 else None} for k, p in self.params.items()},
            "fit": self.fit,
            "source": self.source,
        }

    def write(self, path: str | os.PathLike) -> None:
        """Write the JSON atomically."""
        write_text_atomic(json.dumps(self.to_dict(), indent=2, default=_json_default) + "\n", path)

    @classmethod
    def read(cls, path: str | os.PathLike) -> "Calibration":
        """Read a calibration JSON.

        Raises
        ------
        SchemaError
            Missing file, not JSON, wrong ``servecal.schema`` or a missing field (named).
        """
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise SchemaError(f"{path}: no such calibration file") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SchemaError(f"{path}: not a calibration JSON ({exc})") from None
        if not isinstance(d, dict) or d.get("servecal.schema") != CALIBRATION:
            got = d.get("servecal.schema") if isinstance(d, dict) else type(d).__name__
            raise SchemaError(f"{path}: 'servecal.schema' is {got!r}; expected {CALIBRATION!r} "
                              "(a file written by 'calibrate fit')")
        try:
            params = {}
            for k in PARAM_NAMES:
                p = dict(d["params"][k])
                if p.get("ci95") is not None:
                    p["ci95"] = tuple(p["ci95"])
                params[k] = FittedParam(**p)
            cal = cls(model=ModelSpec.from_dict(d["model"]), gpu=GpuSpec.from_dict(d["gpu"]),
                      tp=d["tp"], form=d["form"], params=params,
                      fit=d.get("fit", {}), source=d.get("source", {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError(f"{path}: calibration field missing or invalid: {exc}") from None
        problem = cal.problem()
        if problem:
            raise SchemaError(f"{path}: {problem}")
        return cal

    def problem(self) -> str | None:
        """What makes the values unusable (None if they are fine): efficiencies in (0, 1.5],
        times finite and >= 0, ``form`` max or sum, ``tp`` a whole number >= 1."""
        import math

        for k, p in self.params.items():
            v = p.value
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                return f"params.{k}.value is {v!r}; expected a finite number"
            if k.startswith("eta_") and not 0 < v <= 1.5:
                return f"params.{k}.value is {v!r}; expected an efficiency in (0, 1.5]"
            if k.endswith("_s") and v < 0:
                return f"params.{k}.value is {v!r}; expected seconds >= 0"
        if self.form not in ("max", "sum"):
            return f"form is {self.form!r}; expected 'max' or 'sum'"
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            return f"tp is {self.tp!r}; expected a whole number >= 1"
        return None


def sha256_of(path: str | os.PathLike) -> str:
    """SHA-256 hex digest of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _json_default(o):
    import numpy as np

    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
