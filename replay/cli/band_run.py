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
    from ..analysis.metrics import window_percentiles

    s = cfg.scheduling
    row = {**prediction_row(result, s.slo_ttft_s, s.slo_tpot_s), **window_percentiles(result, meta)}
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


#: A band too wide to decide: the band of a p90 latency spans more than this factor (high / low).
UNDECIDED_FACTOR = 2.0


def undecided(band, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None) -> str | None:
    """Why ``band`` (:class:`replay.analysis.bands.Band`) is too wide to decide, in words, or None: the band
    of the TTFT or TPOT p90 straddles its SLO (``slo_ttft_s``/``slo_tpot_s``, seconds: its low end meets
    it, its high end does not), or the band of a p90 of TTFT, TPOT or E2E spans more than
    :data:`UNDECIDED_FACTOR` (its low end 0 counts as that)."""
    import math

    stats = (("ttft_p90_s", "TTFT p90", slo_ttft_s), ("tpot_p90_s", "TPOT p90", slo_tpot_s),
             ("e2e_p90_s", "E2E p90", None))
    ends = {s: (band.low.get(s, math.nan), band.high.get(s, math.nan)) for s, _, _ in stats}
    for s, label, slo in stats:
        lo, hi = ends[s]
        if slo is not None and lo <= slo < hi:
            return f"its {label} band [{lo:.3g}, {hi:.3g}] s straddles the SLO {slo:g} s"
    for s, label, _ in stats:
        lo, hi = ends[s]
        if math.isfinite(hi) and hi > 0 and not lo * UNDECIDED_FACTOR >= hi:
            return f"its {label} band [{lo:.3g}, {hi:.3g}] s spans more than a factor {UNDECIDED_FACTOR:g}"
    return None


def advise_hint(cal_path, frame, cfg, band, differences: list) -> str | None:
    """The line pointing to ``calibrate advise`` when ``band`` is too wide to decide (:func:`undecided`,
    under ``cfg``'s SLOs) and the replay is a question (a what-if: ``differences`` from the measured run,
    :func:`.baseline.whatif_differences`, or a trace without measured latencies, a prediction; a replay of
    a measured run has its answer measured), or None. The what-if of this replay (``frame``, a request
    trace, under ``cfg``, a :class:`replay.config.ReplayConfig`) as advise reads one: its concurrency or
    its arrival rate (requests after the first over their span, one replica's share: advise replays one
    engine; none when all arrive at once), its mean prompt and output lengths (tokens) and its engine
    limits."""
    sched, eng = cfg.scheduling, cfg.engine
    measured = any(c in frame and frame[c].notna().any() for c in ("ttft_s", "tpot_s", "e2e_s"))
    why = undecided(band, sched.slo_ttft_s, sched.slo_tpot_s)
    if why is None or (measured and not differences):
        return None
    from ..plan.advice import what_if_command

    what_if: dict = {}
    span = float(frame["arrival_time_s"].max() - frame["arrival_time_s"].min()) if len(frame) else 0.0
    if cfg.closed_loop.concurrency:
        what_if["concurrency"] = cfg.closed_loop.concurrency
    elif span > 0:
        what_if["rate"] = f"{(len(frame) - 1) / span / max(1, sched.replicas):.3g}"
    what_if.update(prompt_tokens=max(1, round(float(frame["num_prompt_tokens"].mean()))),
                   output_tokens=max(1, round(float(frame["num_output_tokens"].mean()))),
                   max_num_seqs=eng.max_num_seqs, max_num_batched_tokens=eng.max_num_batched_tokens)
    return (f"too wide to decide: {why}; the run to measure that would narrow it: "
            f"{what_if_command(cal_path, what_if)}")
