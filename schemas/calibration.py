"""The calibration file: a versioned JSON that ``calibrate`` writes and ``replay`` reads."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from .atomic import write_text_atomic
from .cost_params import PARAMS, FittedParam, check_value
from .engine_settings import canonical
from .errors import SchemaError, text_reason
from .specs import GpuSpec, ModelSpec
from .text import wrap_error

CALIBRATION = "calibration/3"
#: Older versions still read (converted on reading): calibration/1's parameter names, and
#: calibration/2's ``n_half_tokens``, a knee in the step's tokens where calibration/3's is per
#: GPU (:class:`replay.cost.cost_terms.DenseCompute`).
_OLD_CALIBRATION = "calibration/1"
_KNEE_PER_STEP = "calibration/2"
#: Terms of a calibration/1 file: the seed's roofline with the TP all-reduce.
_V1_TERMS = ("step_overhead", "dense_compute", "weight_memory", "kv_memory", "overlap", "tp_comm", "ep_comm")


@dataclass
class Calibration:
    """A fitted cost model with its provenance.

    Attributes
    ----------
    model : ModelSpec
    gpu : GpuSpec
    tp : int
        Tensor-parallel degree of one replica.
    params : dict[str, FittedParam]
        Keyed by names of :data:`schemas.cost_params.PARAMS`; absent ones take their default.
    terms : list[str]
        Names of the cost terms the parameters were fitted with (``replay.cost.cost_terms``).
    dp : int
        Data-parallel ranks stepping as one replica (vLLM ``--data-parallel-size``).
    expert_parallel : bool
        vLLM ``--enable-expert-parallel``.
    engine : dict
        The engine settings the calibration was fitted under (vLLM names:
        ``max_num_seqs``, ``max_num_batched_tokens``, ..., declared in
        :mod:`schemas.engine_settings`; an older name is read as the current one:
        ``speculative_tokens`` as ``num_speculative_tokens``); ``replay`` uses them unless
        an option overrides one.
    fit : dict
        Statistics: method, rows, residuals, correlations, per-variant results.
    source : dict
        ``path``, ``sha256`` and ``kind`` of the trace(s) it was fitted on.
    pp : int
        Pipeline-parallel stages of one replica (vLLM ``--pipeline-parallel-size``); 1 in
        files written before pipeline parallelism.
    band_points : list[dict]
        Points of the parameters' 95 % confidence set (name -> value, natural units; the
        others at ``params``): where the data allow the parameters to be. ``replay`` replays
        at each to put a band on every prediction (:mod:`replay.analysis.bands`); empty in files
        written before bands (then a prediction has no band).
    model_error : dict[str, float]
        Per measured metric (``ttft_s``, ``tpot_s``, ``e2e_s``), the relative misfit of the fit
        beyond the data's sampling noise (:func:`calibrate.discrepancy.model_error`): the bands
        add it to the parameters' uncertainty. Empty for step fits and older files.
    holdout : dict
        The fit's out-of-sample error measured on its own data (:func:`calibrate.holdout.holdout`):
        ``method`` (words), ``errors`` (list of ``{"part", "metric", "pct", "rel_err", "distance"}``:
        a held-out part's relative error of a percentile, and its distance from what the refit saw,
        :func:`replay.analysis.band_parts.distance`) and ``fitted_range`` (feature -> ``[low, high]``,
        the load the calibration's runs span). The bands' model-error part and the distance of a
        what-if come from it; empty for step fits and older files.
    """

    model: ModelSpec
    gpu: GpuSpec
    tp: int
    params: dict
    terms: list = field(default_factory=lambda: list(_V1_TERMS))
    dp: int = 1
    expert_parallel: bool = False
    engine: dict = field(default_factory=dict)
    fit: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)
    band_points: list = field(default_factory=list)
    model_error: dict = field(default_factory=dict)
    pp: int = 1
    holdout: dict = field(default_factory=dict)

    def value(self, name: str) -> float:
        """The value of parameter ``name`` (its declared default when not in the file)."""
        p = self.params.get(name)
        return p.value if p is not None else PARAMS[name].default

    def values(self) -> dict:
        """Every parameter's value, by name (defaults for those not in the file)."""
        return {name: self.value(name) for name in PARAMS}

    @property
    def form(self) -> str:
        """``max``, ``sum`` or ``blend``: how compute and memory combine (from ``overlap``)."""
        return {0.0: "max", 1.0: "sum"}.get(self.value("overlap"), "blend")

    def to_dict(self) -> dict:
        return {
            "servecal.schema": CALIBRATION,
            "model": self.model.to_dict(),
            "gpu": self.gpu.to_dict(),
            "tp": self.tp,
            "dp": self.dp,
            "pp": self.pp,
            "expert_parallel": self.expert_parallel,
            "terms": list(self.terms),
            "params": {k: {**vars(p), "ci95": list(p.ci95) if p.ci95 else None} for k, p in self.params.items()},
            "engine": self.engine,
            "fit": self.fit,
            "source": self.source,
            "band_points": self.band_points,
            "model_error": self.model_error,
            "holdout": self.holdout,
        }

    def write(self, path: str | os.PathLike) -> None:
        """Write the JSON atomically."""
        write_text_atomic(json.dumps(self.to_dict(), indent=2, default=_json_default) + "\n", path)

    @classmethod
    def read(cls, path: str | os.PathLike) -> "Calibration":
        """Read a calibration JSON (``calibration/3``, or ``calibration/1`` or ``/2`` converted).

        Raises
        ------
        SchemaError
            Missing file, not JSON, wrong ``servecal.schema``, a missing field or a value
            outside its declared range (named, with the file).
        """
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise SchemaError(f"{path}: no such calibration file") from None
        except (UnicodeError, RecursionError, ValueError) as exc:  # JSONDecodeError is a ValueError
            raise SchemaError(wrap_error(f"{path}: not a calibration JSON ({text_reason(path, exc)}); expected a "
                                         "file written by 'calibrate fit'")) from None
        version = d.get("servecal.schema") if isinstance(d, dict) else type(d).__name__
        if version not in (CALIBRATION, _OLD_CALIBRATION, _KNEE_PER_STEP):
            raise SchemaError(f"{path}: 'servecal.schema' is {version!r}; expected {CALIBRATION!r} "
                              "(a file written by 'calibrate fit')")
        problem = _shape_problem(d)
        if problem:
            raise SchemaError(wrap_error(f"{path}: {problem}"))
        try:
            raw = dict(d["params"])
            if version == _OLD_CALIBRATION:
                raw = _params_v1(raw, d["form"])
            params = {}
            for k, p in raw.items():
                p = dict(p)
                if p.get("ci95") is not None:
                    p["ci95"] = tuple(p["ci95"])
                params[k] = FittedParam(**p)
            cal = cls(model=ModelSpec.from_dict(d["model"]), gpu=GpuSpec.from_dict(d["gpu"]),
                      tp=d["tp"], params=params, terms=list(d.get("terms", _V1_TERMS)), dp=d.get("dp", 1),
                      expert_parallel=d.get("expert_parallel", False), engine=canonical(dict(d.get("engine") or {})),
                      fit=d.get("fit", {}), source=d.get("source", {}),
                      band_points=[dict(pt.items()) for pt in d.get("band_points") or []],
                      model_error=dict((d.get("model_error") or {}).items()), pp=d.get("pp", 1),
                      holdout=dict((d.get("holdout") or {}).items()))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError, SchemaError) as exc:
            raise SchemaError(wrap_error(f"{path}: calibration field missing or invalid: {exc}")) from None
        problem = cal.problem()
        if problem:
            raise SchemaError(wrap_error(f"{path}: {problem}"))
        if version == _KNEE_PER_STEP:
            _knee_per_gpu(cal)
        return cal

    def problem(self) -> str | None:
        """What makes the file unusable (None if it is fine): a parameter unknown or outside
        its declared physical range (:func:`schemas.cost_params.check_value`), ``tp``/``dp``/``pp``
        not whole numbers >= 1, an unknown term name."""
        for k, p in self.params.items():
            problem = check_value(k, p.value, f"params.{k}.value")
            if problem:
                return problem
        for name, v in (("tp", self.tp), ("dp", self.dp), ("pp", self.pp)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 4096:
                return f"{name} is {v!r}; expected a whole number from 1 to 4096"
        if not isinstance(self.terms, list) or not all(isinstance(t, str) for t in self.terms):
            return f"terms is {self.terms!r}; expected a list of term names"
        for i, pt in enumerate(self.band_points):
            for k, v in pt.items():
                problem = check_value(k, v, f"band_points[{i}].{k}")
                if problem:
                    return problem
        for k, v in self.model_error.items():
            if k not in ("ttft_s", "tpot_s", "e2e_s") or isinstance(v, bool) or not isinstance(v, (int, float)) \
                    or not 0 <= v < 100:
                return f"model_error.{k} is {v!r}; expected ttft_s, tpot_s or e2e_s with a fraction >= 0"
        problem = _holdout_problem(self.holdout)
        if problem:
            return problem
        for name in ("source", "fit", "engine"):
            if not isinstance(getattr(self, name), dict):
                return f"{name} is {getattr(self, name)!r}; expected an object"
        if not isinstance(self.expert_parallel, bool):
            return f"expert_parallel is {self.expert_parallel!r}; expected true or false"
        return None


def fit_grade(stats: dict) -> tuple[str, str]:
    """A fit's quality in words from its statistics (a calibration's ``fit``, a fit result's ``stats``):
    ``("good" | "fair" | "poor" | "", details)``: a step fit by its median relative step error, a
    request fit by its median relative quantile error (under 5 % good, under 15 % fair); ``""`` when
    the statistics hold neither, or hold them in another shape (a file's ``fit`` block is not checked
    on reading: it only informs)."""
    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v

    def word(v: float) -> str:
        return "good" if v < 0.05 else "fair" if v < 0.15 else "poor"

    steps = stats.get("rel_residual_pct")
    if isinstance(steps, dict) and number(steps.get("p50")) and number(steps.get("p90")):
        p50, p90 = steps["p50"], steps["p90"]
        by_kind = stats.get("rel_residual_p50_by_kind")
        kinds = ", ".join(f"{k} {v:.1%}" for k, v in by_kind.items() if number(v)) if isinstance(by_kind, dict) else ""
        return word(p50), f"median step error {p50:.1%}, p90 {p90:.1%}; by kind {kinds}; {stats.get('n_rows')} steps"
    by_run = stats.get("residual_by_run")
    errs = sorted(abs(v) for run in (by_run.values() if isinstance(by_run, dict) else ()) if isinstance(run, dict)
                  for e in run.values() if isinstance(e, dict) for v in e.values() if number(v))
    if not errs:
        return "", "no residuals recorded"
    med, worst = errs[len(errs) // 2], errs[-1]
    return word(med), (f"median quantile error {med:.1%}, worst {worst:.1%}; {stats.get('n_runs', 1)} run(s), "
                       f"{stats.get('n_requests')} requests, {stats.get('n_replays')} replays")


#: The range a held-out error's fields and a fitted load may take (anything else is not a fit's output).
_HOLDOUT_LIMITS = {"rel_err": (-100.0, 100.0), "distance": (0.0, 1000.0)}
_FITTED_RANGE_LIMITS = (1e-9, 1e12)


def _holdout_problem(holdout: dict) -> str | None:
    """What is wrong with a calibration's ``holdout`` (None if fine), naming the field: ``errors`` a list
    of objects with ``metric`` ttft_s/tpot_s/e2e_s, ``rel_err`` in (-100, 100) and ``distance`` in
    [0, 1000]; ``fitted_range`` an object of ``[low, high]`` pairs, 1e-9 <= low <= high <= 1e12."""
    import math

    def js(v) -> str:
        try:
            return json.dumps(v, allow_nan=True)[:80]
        except (TypeError, ValueError):
            return repr(v)[:80]

    errors, ranges = holdout.get("errors", []), holdout.get("fitted_range", {})
    if not isinstance(errors, list):
        return f"holdout.errors is {js(errors)}; expected a list of held-out errors (refit with 'calibrate fit')"
    if not isinstance(ranges, dict):
        return f"holdout.fitted_range is {js(ranges)}; expected an object of [low, high] pairs"
    for i, e in enumerate(errors):
        if not isinstance(e, dict):
            return f"holdout.errors[{i}] is {js(e)}; expected an object with metric, rel_err and distance"
        if e.get("metric") not in ("ttft_s", "tpot_s", "e2e_s"):
            return f"holdout.errors[{i}].metric is {js(e.get('metric'))}; expected ttft_s, tpot_s or e2e_s"
        for k, (lo, hi) in _HOLDOUT_LIMITS.items():
            v = e.get(k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v < hi:
                return f"holdout.errors[{i}].{k} is {js(v)}; expected a number from {lo:g} to {hi:g}"
    lo, hi = _FITTED_RANGE_LIMITS
    for k, v in ranges.items():
        ok = isinstance(v, list) and len(v) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)
        if not (ok and lo <= v[0] <= v[1] <= hi):
            return f"holdout.fitted_range.{k} is {js(v)}; expected [low, high] with {lo:g} <= low <= high <= {hi:g}"
    return None


def _shape_problem(d: dict) -> str | None:
    """What is wrong with the shape of the optional ``band_points`` (a list of objects of
    parameter values) and ``model_error`` (an object of metric fractions), None if fine;
    their values are checked by :meth:`Calibration.problem`."""
    points, error = d.get("band_points"), d.get("model_error")
    if points is not None:
        if not isinstance(points, list):
            return (f"band_points is {_json_type(points)}; expected a list of objects of parameter values "
                    "(refit with 'calibrate fit', or delete the field for no band)")
        for i, pt in enumerate(points):
            if not isinstance(pt, dict):
                return f"band_points[{i}] is {_json_type(pt)}; expected an object of parameter values"
    if d.get("holdout") is not None and not isinstance(d["holdout"], dict):
        return f"holdout is {_json_type(d['holdout'])}; expected an object (refit with 'calibrate fit')"
    if error is not None and not isinstance(error, dict):
        return (f"model_error is {_json_type(error)}; expected an object of fractions by metric, e.g. "
                '{"ttft_s": 0.05}')
    return None


def _json_type(v) -> str:
    """The JSON type of ``v`` with its article (``null``, ``a string``, ``an object``, ...)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    return {str: "a string", int: "a number", float: "a number", list: "a list", dict: "an object"}.get(
        type(v), f"a {type(v).__name__}")


def _params_v1(raw: dict, form: str) -> dict:
    """calibration/1's parameters in calibration/2 names: ``t_launch_s + t_cpu_s`` is the
    per-step constant ``t_step_s``; form ``max``/``sum`` is ``overlap`` 0/1."""
    if form not in ("max", "sum"):
        raise ValueError(f"form is {form!r}; expected 'max' or 'sum'")
    out = {k: raw[k] for k in ("eta_compute", "eta_mem")}
    launch, cpu = dict(raw["t_launch_s"]), dict(raw.get("t_cpu_s") or {"value": 0.0})
    launch["value"] = launch["value"] + cpu["value"]
    out["t_step_s"] = launch
    out["overlap"] = {"value": 0.0 if form == "max" else 1.0, "vary": False, "bound": f"form {form} (calibration/1)"}
    return out


def _knee_per_gpu(cal: "Calibration") -> None:
    """A calibration/2 file's ``n_half_tokens`` (the knee in the step's tokens, on its ``tp x dp``
    GPUs) as calibration/3's knee per GPU: value, standard error, interval and band points divided
    by ``tp x dp``, so the file prices every step as it did at its own parallelism."""
    gpus = cal.tp * cal.dp
    p = cal.params.get("n_half_tokens")
    if gpus == 1 or p is None:
        return
    cal.params["n_half_tokens"] = replace(
        p, value=p.value / gpus, stderr=None if p.stderr is None else p.stderr / gpus,
        ci95=None if p.ci95 is None else (p.ci95[0] / gpus, p.ci95[1] / gpus))
    for point in cal.band_points:
        if "n_half_tokens" in point:
            point["n_half_tokens"] = point["n_half_tokens"] / gpus


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
