"""Where ``replay`` replays its band points: here one after the other when that is quick, else
in local worker processes (:func:`replay.parallel.worker_pool`); the band is the same."""
from __future__ import annotations

import contextlib
import os

#: Below this many seconds of replays in all, the band points are replayed here: spawning
#: workers (each imports numpy, pandas and the engine) costs about that much.
SERIAL_BELOW_S = 3.0


@contextlib.contextmanager
def band_mapper(replays: int, seconds_each: float, jobs: int | None = None):
    """A ``mapper(fn, items) -> list`` for :func:`replay.analysis.bands.predict_with_band`, or None (run
    here) when ``replays`` replays of ``seconds_each`` seconds take less than
    :data:`SERIAL_BELOW_S` or one process is all there is (``jobs``, default the CPU count)."""
    workers = min(jobs or os.cpu_count() or 1, replays)
    if workers <= 1 or replays * seconds_each < SERIAL_BELOW_S:
        yield None
        return
    from ..parallel import worker_pool

    with worker_pool(workers) as mapper:
        yield mapper


def band_of_replay(frame, meta, cost_model, cfg, points: list, point_row: dict, seconds_each: float,
                   basis=None, result=None):
    """The band of one replay already run (``point_row``: its :func:`replay.analysis.bands.prediction_row`,
    which took ``seconds_each`` seconds; ``result`` its frame, for the band's sampling noise and
    distance), from its calibration's ``points`` (None: no band at all, not even the seed spread of a
    replay that draws random numbers) and ``basis`` (:class:`replay.analysis.bands.BandBasis`: the
    rest of what the band takes from the calibration).

    ``cfg`` is replayed without recording token times, steps or step requests (the band needs
    the latencies only).
    """
    from dataclasses import replace

    from ..analysis.bands import BandBasis, BandJob, band_of_rows, point_details, predict_with_band
    from ..config import RecordOptions

    if points is None:  # --no-band
        return band_of_rows(point_row, [])
    basis = basis or BandBasis()
    details = point_details(result, basis.new_sample) if result is not None else None
    if not points and not cfg.engine.num_speculative_tokens:
        return band_of_rows(point_row, [], basis=basis, details=details)
    job = BandJob(frame, meta or {}, cost_model, replace(cfg, record=RecordOptions()), list(points), basis)
    with band_mapper(len(job.replays()) - 1, seconds_each) as mapper:
        return predict_with_band(job, point_row, mapper, details)


def main_band(frame, meta, cost_model, cfg, points: list, result, seconds_each: float, basis=None):
    """The band of ``replay``'s own replay (``result``, which took ``seconds_each`` seconds):
    :func:`band_of_replay` at the calibration's ``points`` and ``basis``; the point alone when
    ``points`` is None (``--no-band``)."""
    from ..analysis.bands import prediction_row

    s = cfg.scheduling
    row = prediction_row(result, s.slo_ttft_s, s.slo_tpot_s)
    return band_of_replay(frame, meta, cost_model, cfg, points, row, seconds_each, basis, result)


def slo_words(scheduling) -> str | None:
    """``"ttft <= 0.5 s, tpot <= 0.05 s"``: the SLOs of ``--slo-ttft-s``/``--slo-tpot-s`` (None: neither)."""
    slos = [f"{k} <= {v} s" for k, v in (("ttft", scheduling.slo_ttft_s), ("tpot", scheduling.slo_tpot_s))
            if v is not None]
    return ", ".join(slos) or None


def measured_goodput(result, scheduling) -> float | None:
    """The measured run's goodput under the SLOs (requests/s), when it has latencies and an SLO is given."""
    if slo_words(scheduling) is None or not {"ttft_s", "tpot_s", "e2e_s"} <= set(result.columns):
        return None
    from ..analysis.metrics import goodput_rps

    return goodput_rps(result, scheduling.slo_ttft_s, scheduling.slo_tpot_s, prefix="")
