"""One rule for "identified" (issue 21, item 3): never for a value at its interval's edge, or an
interval that reaches the lower end of the parameter's range (``t_step_s`` 2.407 ms in
[0, 2.456] was "identified"); when no interval is traced, the reason is said. The rule
(``calibrate.identify.identification``) on constructed cases, then each tracer using it:
the confidence set of a request fit, a step fit's bootstrap, the delta method."""
import numpy as np
import pytest

from calibrate.confidence import confidence_set_intervals
from calibrate.fitting import FitResult
from calibrate.identify import identification
from calibrate.step_fit import set_ci95
from schemas.calibration import FittedParam
from schemas.cost_params import param_cells


@pytest.mark.parametrize("name,value,ci,kind,why", [
    # the issue's case: its value near the top of an interval reaching 0
    ("t_step_s", 2.407e-3, (0.0, 2.456e-3), "range",
     "its 95 % interval [0 s, 2.46 ms] reaches 0 s, the lower end of its range; the data give <= 2.46 ms"),
    ("eta_compute", 0.3, (0.01, 0.5), "range",
     "its 95 % interval [0.01, 0.5] reaches 0.01, the lower end of its range; the data give <= 0.5"),
    # a value at (or beyond) its interval's edge: the interval was traced on one side only
    ("eta_mem", 0.801, (0.80, 0.85), "edge", "its value 0.801 is at the edge of its 95 % interval [0.8, 0.85]"),
    ("eta_mem", 0.849, (0.80, 0.85), "edge", "its value 0.849 is at the edge of its 95 % interval [0.8, 0.85]"),
    ("eta_mem", 0.9, (0.80, 0.85), "edge", "its value 0.9 is at the edge of its 95 % interval [0.8, 0.85]"),
    # wider than +-98 % of the value
    ("t_seq_s", 2e-5, (1e-6, 6e-5), "wide", "the data allow any value in [1 us, 60 us]"),
    # at a bound of its range: one side
    ("t_step_s", 0.0, (0.0, 1e-3), "bound", "at its lower bound; the data give <= 1 ms"),
    ("eta_mem", 1.0, (0.9, 1.0), "bound", "at its upper bound; the data give >= 0.9"),
    ("t_step_s", 0.0, None, "bound", "at its lower bound; the data give nothing more"),
    # no interval: the caller's reason
    ("eta_mem", 0.8, None, "none", "why not"),
    ("eta_mem", 0.8, (0.8, 0.8), "none", "why not"),
    ("eta_mem", 0.8, (np.nan, 0.9), "none", "why not"),
    ("eta_mem", 0.8, (0.7, np.inf), "none", "why not"),
    # identified: inside, away from both edges, narrow enough, clear of the lower end
    ("eta_mem", 0.785, (0.765, 0.806), None, None),
    ("t_step_s", 4e-4, (1.4e-4, 4.5e-4), None, None),  # the demo's (README): skewed, not at its edge
    ("t_step_s", 4e-4, (1.4e-4, 4.1e-4), "edge", "its value 0.4 ms is at the edge of its 95 % interval "
                                                  "[0.14 ms, 0.41 ms]"),
    ("eta_mem", 0.97, (0.94, 1.0), None, None),  # an efficiency may reach 1: still pinned on both sides
])
def test_the_rule(name, value, ci, kind, why):
    assert identification(name, value, ci, "why not") == (kind, why)


def test_the_issue_case_prints_not_identified_with_the_side_the_data_give():
    _, why = identification("t_step_s", 2.407e-3, (0.0, 2.456e-3))
    p = FittedParam(2.407e-3, 0.5e-3, False, why, True, (0.0, 2.456e-3))
    assert param_cells("t_step_s", p) == ("2.407 ms", "<= 2.46 ms", "NOT IDENTIFIED")


# --- the confidence set of a request fit: residuals whose set is known by hand --------------------

SIGMA, N_Q = 0.1, 4


def _intervals(name, value, residual):
    params = {name: FittedParam(value, None, True, None, True)}
    return confidence_set_intervals(residual, params, SIGMA ** 2 * np.eye(N_Q))


def test_a_confidence_set_reaching_zero_is_not_identified():
    """t_step_s at 2.407 ms: the quantiles jump 0.125 ms above it (beyond the Jacobian's step,
    0.12 ms) and barely move below, so the set traced is [0, < 2.532 ms]. The old rule
    (half-width within 98 % of the value) said identified."""
    t0 = 2.407e-3

    def residual(p):
        dx = (p["t_step_s"] - t0) / 1e-3
        return np.full(N_Q, 0.02 * dx + (10.0 if dx > 0.125 else 0.0))

    out, warns, _ = _intervals("t_step_s", t0, residual)
    p = out["t_step_s"]
    lo, hi = p.ci95
    assert lo == 0.0 and t0 < hi <= t0 + 0.125e-3
    assert (hi - lo) / 2 <= 1.96 * 0.5 * t0  # narrow enough for the old rule
    assert not p.identifiable
    assert p.bound == ("its 95 % interval [0 s, 2.53 ms] reaches 0 s, the lower end of its range; the data give "
                       "<= 2.53 ms")
    assert [w for w in warns if w.startswith("t_step_s: NOT IDENTIFIED, its 95 % interval [0 s,")]


def test_a_confidence_set_traced_on_one_side_only_is_not_identified():
    """The quantiles jump 0.0003 above eta_mem = 0.5: the Jacobian's step (0.05) sees the jump,
    the walk down goes its full 8 model distances (0.0123), the walk up ends below 0.0003. The
    old rule (half-width 0.006 within 98 % of the value) said identified."""
    def residual(p):
        dx = p["eta_mem"] - 0.5
        return np.full(N_Q, 0.5 * dx + (10.0 if dx > 0.0003 else 0.0))

    out, warns, _ = _intervals("eta_mem", 0.5, residual)
    p = out["eta_mem"]
    lo, hi = p.ci95
    assert 0.5 - lo > 0.01 and 0.0 < hi - 0.5 <= 0.0003
    assert not p.identifiable and p.bound.startswith("its value 0.5 is at the edge of its 95 % interval [")
    assert any(w.startswith("eta_mem: NOT IDENTIFIED, its value 0.5 is at the edge") for w in warns)


def test_a_symmetric_narrow_confidence_set_is_identified():
    out, warns, _ = _intervals("eta_mem", 0.5, lambda p: np.full(N_Q, 2.0 * (p["eta_mem"] - 0.5)))
    assert out["eta_mem"].identifiable and warns == []


# --- a step fit's bootstrap intervals ------------------------------------------------------------

def _fit(**params):
    return FitResult("max", dict(params), {}, 0.0, {}, [], "")


def test_a_bootstrap_interval_reaching_zero_is_not_identified():
    fit = _fit(t_step_s=FittedParam(2.407e-3, 0.4e-3), eta_mem=FittedParam(0.785, 0.01))
    set_ci95(fit, "bootstrap", {"t_step_s": (0.0, 2.456e-3), "eta_mem": (0.765, 0.806)})
    t, e = fit.params["t_step_s"], fit.params["eta_mem"]
    assert not t.identifiable and t.ci95 == (0.0, 2.456e-3) and t.bound.startswith("its 95 % interval [0 s, 2.46 ms]")
    assert e.identifiable and e.ci95 == (0.765, 0.806)
    assert fit.warnings == ["t_step_s: NOT IDENTIFIED, its 95 % interval [0 s, 2.46 ms] reaches 0 s, the lower end "
                            "of its range; the data give <= 2.46 ms"]


def test_a_bootstrap_that_traced_no_interval_says_why():
    fit = _fit(eta_mem=FittedParam(0.785, 0.01))
    set_ci95(fit, "bootstrap", {"eta_mem": (0.785, 0.785)})
    assert not fit.params["eta_mem"].identifiable
    assert fit.warnings == ["eta_mem: NOT IDENTIFIED, the bootstrap fits traced no interval (every resample gave "
                            "the same value)"]


def test_an_exact_fit_stays_identified_with_no_uncertainty():
    """Zero residuals: zero stderr and a zero-width interval is the right answer (docs/CASES.md BR-20)."""
    fit = _fit(eta_mem=FittedParam(0.785, 0.0))
    set_ci95(fit, "bootstrap", {"eta_mem": (0.785, 0.785)})
    assert fit.params["eta_mem"].identifiable and fit.warnings == []


# --- the delta method (step fits): a clipped interval ----------------------------------------------

def test_the_delta_method_uses_the_rule():
    """eta_compute 0.02 +- 1.96 x 0.0075 reaches 0.01, the lower end of its range: once
    "identified" (stderr within half the value), now NOT IDENTIFIED with the side the data give."""
    import lmfit

    from calibrate.identify import assess

    slope = 1.0 / 0.0075 / np.sqrt(8)  # stderr 0.0075 from 8 residuals of unit scatter around the line
    rng = np.random.default_rng(0)
    noise = rng.standard_normal(8)
    noise = (noise - noise.mean()) / noise.std(ddof=1)  # RSS / (n - p) = 1 exactly

    def residual(cp):
        return slope * (cp["eta_compute"] - 0.02) + noise

    res = lmfit.minimizer.MinimizerResult()
    res.params = lmfit.Parameters()
    res.params.add("eta_compute", value=0.02)
    params, _, warns = assess(res, residual, ["eta_compute"], {}, 1e-3)
    p = params["eta_compute"]
    assert p.stderr == pytest.approx(0.0075, rel=1e-6)
    assert not p.identifiable
    assert p.bound == ("its 95 % interval [0.01, 0.0347] reaches 0.01, the lower end of its range; the data give "
                       "<= 0.0347")
    assert warns == [f"eta_compute: NOT IDENTIFIED, {p.bound}"]
