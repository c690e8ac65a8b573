"""What a prediction band takes from its calibration besides the band points: the held-out model
error and fitted load, the in-sample misfit, the fit's grade, and what the calibration is carried
across to the replay (:class:`BandBasis`, :func:`carried_across`); :mod:`replay.analysis.bands`
composes the band from it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .band_parts import TRANSFER_ERROR


#: ``source.format`` of a calibration fitted on a kernel profile (no engine around the kernels).
KERNEL_PROFILE_FORMATS = ("llmservingsim_profile",)


def carried_across(cal, cost_model) -> list[str]:
    """What calibration ``cal`` is carried across to a replay with ``cost_model``: another model, GPU
    or parallelism than it was fitted on, or a kernel profile's timings to an engine's latencies; one
    phrase each (empty: not carried). The engine (colocated or disaggregated) is the scheduler's, so
    it is :meth:`BandBasis.with_scheduler`'s."""
    out = []
    for what, fitted, now in (("the model", cal.model.name, cost_model.model.name),
                              ("the GPU", cal.gpu.name, cost_model.gpu.name),
                              ("TP", cal.tp, cost_model.tp), ("DP", cal.dp, cost_model.dp),
                              ("PP", cal.pp, getattr(cost_model, "pp", 1)),
                              ("expert parallelism", cal.expert_parallel, cost_model.expert_parallel)):
        if fitted != now:
            out.append(f"{what} ({fitted} -> {now})")
    if cal.source.get("format") in KERNEL_PROFILE_FORMATS:
        out.append("a kernel profile to an engine's latencies (no CPU time between kernels)")
    return out


@dataclass(frozen=True)
class BandBasis:
    """What a band takes from its calibration besides its points.

    Attributes
    ----------
    model_error : dict
        The in-sample misfit beyond sampling noise (:attr:`schemas.calibration.Calibration.model_error`),
        used for a metric without held-out errors.
    holdout : dict
        :attr:`schemas.calibration.Calibration.holdout`: held-out errors and the fitted load range.
    carried : tuple of str
        What the calibration is carried across to this replay (``"the model: llama-3.1-8b -> qwen3-32b"``);
        non-empty adds the transfer part (:data:`replay.analysis.band_parts.TRANSFER_ERROR`).
    transfer_error : dict
        Metric -> relative transfer error (default the measured table).
    grade : str
        The calibration's fit quality in words (:func:`schemas.calibration.fit_grade`); a band of a
        ``poor`` one is not meaningful, and says so.
    new_sample : bool
        The band is for another sample of requests like these (a plan's future traffic): it adds the
        percentiles' sampling noise. A replay of given requests predicts a run of those very
        requests, which shares their sample: no sampling part.
    fitted_disagg : bool
        The calibration was fitted on a disaggregated run.
    scheduler : str or None
        The scheduler of the replay the band is for (:meth:`with_scheduler`); with ``fitted_disagg``
        it says whether the calibration is carried across the engine too.
    """

    model_error: dict = field(default_factory=dict)
    holdout: dict = field(default_factory=dict)
    carried: tuple = ()
    transfer_error: dict = field(default_factory=lambda: dict(TRANSFER_ERROR))
    grade: str = ""
    new_sample: bool = False
    fitted_disagg: bool = False
    scheduler: str | None = None

    @classmethod
    def of(cls, cal, carried=(), new_sample: bool = False, scheduler: str | None = None) -> "BandBasis":
        """The basis of calibration ``cal`` (:class:`schemas.calibration.Calibration`), carried across
        ``carried`` (:func:`carried_across`), for a replay under ``scheduler``."""
        from schemas.calibration import fit_grade

        return cls(dict(cal.model_error), dict(cal.holdout), tuple(carried), grade=fit_grade(cal.fit)[0],
                   new_sample=new_sample, fitted_disagg=cal.engine.get("scheduler") == "disagg", scheduler=scheduler)

    def with_scheduler(self, scheduler: str) -> "BandBasis":
        """This basis for a replay under ``scheduler`` (a row of a scheduler comparison or a sweep)."""
        return replace(self, scheduler=scheduler)

    @property
    def carried_all(self) -> tuple:
        """:attr:`carried`, and the engine when the replay's scheduler is disaggregated and the fit's
        was not, or the reverse."""
        if self.scheduler is None or (self.scheduler == "disagg") == self.fitted_disagg:
            return tuple(self.carried)
        return (*self.carried, "the engine (a colocated fit to disaggregated pools)" if not self.fitted_disagg
                else "the engine (disaggregated pools to a colocated engine)")

    @property
    def informative(self) -> bool:
        """Whether it widens a band beyond the parameters' range (any part but the points)."""
        return bool(self.holdout.get("errors") or any(self.model_error.values()) or self.carried_all)
