"""The tables a replay returns: the predicted columns of each request, the speculative-decoding
counts and disaggregation's transfers, the simulated step trace (:func:`replay.simulate.replay_frame` builds them)."""
from __future__ import annotations

import math
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from schemas.status import NOT_SIMULATED, OK, because
from schemas.step_record import KEPT_NAMES, StepRow, derived_columns

if TYPE_CHECKING:
    from ..cost.cost_model import StepCostModel
    from .engine import Engine
    from .request import Request


def spec_columns(engine: Engine, num_rows: int) -> dict[str, np.ndarray]:
    """Per-request speculative-decoding columns of the replay result, by trace row.

    Returns
    -------
    dict
        ``pred_num_draft_tokens`` (int64: draft tokens the request's decodes verified),
        ``pred_num_accepted_tokens`` (int64: those accepted) and ``pred_acceptance_length``
        (float64: mean tokens emitted per verify step, ``1 + accepted / verify steps``, as
        vLLM reports it; NaN for a request that verified no draft).
    """
    drafts, accepted = np.zeros(num_rows, np.int64), np.zeros(num_rows, np.int64)
    length = np.full(num_rows, np.nan)
    for i, (steps, d, a) in engine.spec_counts.items():
        drafts[i], accepted[i], length[i] = d, a, 1.0 + a / steps
    return {"pred_num_draft_tokens": drafts, "pred_num_accepted_tokens": accepted, "pred_acceptance_length": length}


def transfer_columns(transfers: dict, handoff_wait_s: dict, num_rows: int) -> dict[str, np.ndarray]:
    """Per-request disaggregation columns of the replay result, by trace row.

    Parameters
    ----------
    transfers : dict[int, replay.core.disagg.Transfer]
        By trace row, every request whose KV moved (:attr:`replay.core.disagg.DisaggEngine.transfers`).
    handoff_wait_s : dict[int, float]
        By trace row, the hand-off wait, seconds (absent: 0).
    num_rows : int
        Rows of the trace.

    Returns
    -------
    dict
        ``pred_decode_replica_id`` (int64, -1 when the KV never moved),
        ``pred_kv_transfer_s`` (float64, seconds, NaN when it never moved),
        ``pred_decode_queue_wait_s`` (float64, transfer end to decode admission, seconds) and
        ``pred_handoff_wait_s`` (float64, seconds: with ``pull`` the prompt's end to the start of
        its migration: a decode instance's acceptance, then its earlier migrations; with
        ``prealloc`` the arrival to the decode reservation, a part of the queue wait; 0 with
        ``push``; NaN when the KV never moved).
    """
    dec = np.full(num_rows, -1, np.int64)
    xfer, dq, hw = np.full(num_rows, np.nan), np.full(num_rows, np.nan), np.full(num_rows, np.nan)
    for i, t in transfers.items():
        dec[i] = t.decode_replica_id
        xfer[i] = t.end_time_s - t.start_time_s
        dq[i] = t.decode_admitted_time_s - t.end_time_s
        hw[i] = handoff_wait_s.get(i, 0.0)
    return {"pred_decode_replica_id": dec, "pred_kv_transfer_s": xfer, "pred_decode_queue_wait_s": dq,
            "pred_handoff_wait_s": hw}


def spec_decode_stats(engine: Engine) -> dict:
    """Speculative decoding over the whole run, as vLLM's spec-decode metrics name them.

    Returns
    -------
    dict
        ``num_drafts`` (verify steps: decodes that verified at least one draft),
        ``num_draft_tokens``, ``num_accepted_tokens``, ``acceptance_rate`` (accepted /
        draft tokens, in [0, 1]) and ``acceptance_length`` (``1 + accepted / drafts``: mean
        tokens per verify step); the last two NaN when nothing was drafted.
    """
    steps = sum(c[0] for c in engine.spec_counts.values())
    drafts = sum(c[1] for c in engine.spec_counts.values())
    accepted = sum(c[2] for c in engine.spec_counts.values())
    return {"num_drafts": steps, "num_draft_tokens": drafts, "num_accepted_tokens": accepted,
            "acceptance_rate": accepted / drafts if drafts else math.nan,
            "acceptance_length": 1.0 + accepted / steps if steps else math.nan}


def predicted_columns(out_tokens: np.ndarray, reqs: list[Request], token_times: bool = False,
                      frontend_s: np.ndarray | None = None, stream_per_token_s: float = 0.0) -> dict:
    """The predicted columns of the simulated ``reqs``, by trace row (rows not simulated: status only).

    Parameters
    ----------
    out_tokens : numpy.ndarray of int64, shape (n,)
        The trace's ``num_output_tokens``, one per row.
    reqs : list of Request
        The requests simulated (``Request.index``: their rows).
    token_times : bool
        Add ``pred_token_times_s`` (the requests recorded them).
    frontend_s : numpy.ndarray of float, shape (n,), optional
        Seconds before the engine, per row.
    stream_per_token_s : float
        Seconds per streamed output token after the first.

    Returns
    -------
    dict
        Column name -> values, shape (n,): ``pred_queue_wait_s``, ``pred_ttft_s``, ``pred_tpot_s``,
        ``pred_e2e_s`` (seconds, float), ``pred_replica_id``, ``pred_num_preemptions`` (int64),
        ``pred_status`` (object) and the optional ones below, in this order.

    Notes
    -----
    Latencies are from the client's send (the trace's arrival): the engine's, plus
    ``frontend_s`` on every token and ``stream_per_token_s`` per token after the first; the
    queue wait is the engine's. With those delays there are also ``pred_frontend_s`` (before
    the engine) and ``pred_stream_s`` (after its last token), seconds, so the engine's own
    timeline can be rebuilt (the report's running counts)."""
    n = len(out_tokens)

    def column(name: str, dtype) -> np.ndarray:
        return np.fromiter(map(attrgetter(name), reqs), dtype, len(reqs))

    def scattered(values: np.ndarray, fill) -> np.ndarray:  # by row; rows not simulated get ``fill``
        if len(reqs) == n:  # every row, in order (TraceRequests.requests keeps the row order)
            return values
        out = np.full(n, fill, dtype=values.dtype)
        out[idx] = values
        return out

    idx = column("index", np.int64) if len(reqs) != n else None
    status_sim = column("status", object)
    ok = status_sim == OK
    arrival = column("arrival_time_s", float)
    qw, ttft, e2e = (scattered(np.where(ok, column(name, float) - arrival, np.nan), np.nan)
                     for name in ("first_scheduled_time_s", "first_token_time_s", "last_token_time_s"))
    outside = None
    if frontend_s is not None or stream_per_token_s:
        fe = frontend_s if frontend_s is not None else np.zeros(n)
        stream = stream_per_token_s * np.maximum(out_tokens - 1, 0)
        ttft, e2e = ttft + fe, e2e + fe + stream
        outside = (np.where(np.isfinite(e2e), fe, np.nan), np.where(np.isfinite(e2e), stream, np.nan))
    times: list[list[float] | None] | None = None  # per row, its token times relative to arrival, s
    if token_times:
        times = [None] * n
        for r in reqs:
            if r.status == OK and r.token_times_s is not None:
                shift = r.arrival_time_s - (0.0 if frontend_s is None else frontend_s[r.index])
                times[r.index] = [t - shift + stream_per_token_s * i for i, t in enumerate(r.token_times_s)]
    from schemas.metrics import tpot_s

    pred = {"pred_queue_wait_s": qw, "pred_ttft_s": ttft, "pred_tpot_s": tpot_s(ttft, e2e, out_tokens),
            "pred_e2e_s": e2e, "pred_replica_id": scattered(column("replica_id", np.int64), -1),
            "pred_num_preemptions": scattered(column("num_preemptions", np.int64), 0),
            "pred_status": scattered(status_sim, because(NOT_SIMULATED, "failed in trace"))}
    if times is not None:
        pred["pred_token_times_s"] = times
    if outside is not None:
        pred["pred_frontend_s"], pred["pred_stream_s"] = outside
    return pred


def result_frame(df: pd.DataFrame, columns: dict) -> pd.DataFrame:
    """``df`` with ``columns`` (name -> one value per row) after its own, in their order; a column
    ``df`` already has (a replay's result replayed) is overwritten in its place."""
    # one concat, not a column at a time
    new = {name: v for name, v in columns.items() if name not in df.columns}
    res = pd.concat([df, pd.DataFrame(new, index=df.index)], axis=1)
    for name in columns.keys() - new.keys():
        res[name] = columns[name]
    return res


def steps_frame(engine: Engine) -> pd.DataFrame:
    """The simulated step trace of an engine run with ``record_steps``.

    Returns
    -------
    pandas.DataFrame
        One row per step, by replica then start time (the same order on the fast and the
        step-by-step paths), the step record's columns (:data:`schemas.step_record.STEP_RECORD`;
        ``num_decode_tokens`` only under speculative decoding, else it equals
        ``num_decode_seqs``), then, when the replicas' cost models have ``eval_components``,
        one float64 column ``t_<term>_s`` per term (:meth:`RooflineCostModel.eval_components`,
        seconds; ``t_overlap_s`` <= 0 the time hidden by overlapping compute and memory).
        Those sum to ``step_duration_s`` (to rounding) but for the KV copy of a swap
        preemption, which the engine adds to its step.
    """
    frame = pd.DataFrame(engine.steps, columns=list(StepRow._fields))
    frame = frame.sort_values(["replica_id", "step_start_time_s"], kind="stable", ignore_index=True)
    frame = frame.assign(**derived_columns(frame))
    if not engine.spec_tokens:
        frame = frame.drop(columns="num_decode_tokens")
    models = _recorded_cost_models(engine)
    if not len(frame) or not all(hasattr(cm, "eval_components") for cm in models):
        return frame
    replica = frame["replica_id"].to_numpy(np.int64)
    parts: dict[str, np.ndarray] = {}
    for rid in np.unique(replica) if len(set(map(id, models))) > 1 else [None]:
        rows = slice(None) if rid is None else replica == rid
        features = {name: frame[name].to_numpy(np.int64)[rows] for name in KEPT_NAMES if name in frame}
        for term, t in models[0 if rid is None else rid].eval_components(**features).items():
            parts.setdefault(term, np.zeros(len(frame)))[rows] = t
    return frame.assign(**{f"t_{term}_s": t for term, t in parts.items()})


def _recorded_cost_models(engine: Engine) -> list:
    """The cost model of each ``replica_id`` of :attr:`Engine.steps` (a pipelined replica's
    steps carry its group's index, :class:`replay.core.pipeline.PipelineEngine`)."""
    group_of = getattr(engine, "group_of", None)
    if group_of is None:
        return engine.cost_models
    first: dict[int, StepCostModel] = {}
    for rid, g in enumerate(group_of):
        first.setdefault(g, engine.cost_models[rid])
    return [first[g] for g in sorted(first)]
