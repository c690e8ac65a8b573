"""Import BLIS TraceV2 files (``blis observe``): a YAML header plus a per-request CSV.

Format source: the public repository inference-sim/inference-sim, read at commit
``0045b72691ecf9a9cb82ad3170e9c6a8e060f531`` (``sim/workload/tracev2.go`` and
``sim/workload/tracev2_test.go``), with ``cmd/observe.go`` (commit 157882a6...),
``cmd/observe_cmd.go`` (commit 020b7c85...), ``sim/workload/calibrate.go`` (commit
0c91ac06...) and ``docs/guide/observe-replay-calibrate.md`` (commit 50afd81c...). Only the
format was taken from them; the reader below is servecal's own.

``blis observe ... --trace-header trace.yaml --trace-data trace.csv`` writes two files::

    trace_version: 3            # 2, or 3 (3 adds goodput_slo_targets; the CSV is the same)
    time_unit: us               # "us" from observe, "microseconds" in BLIS's own tests
    mode: real                  # real (observe), generated (blis run), replayed (blis replay)
    warm_up_requests: 0
    server: {type: vllm, model: ..., tensor_parallel: 1, max_num_seqs: 256, block_size: 16,
             gpu_memory_utilization: 0.9, max_model_len: 4096}     # zero fields are omitted
    network: {measured_rtt_ms: 2.5}
    goodput_slo_targets: {critical: {ttft_ms: 100, itl_ms: 50, e2e_ms: 5000}}   # v3 only

    request_id,client_id,tenant_id,slo_class,[vllm_priority,]session_id,round_index,prefix_group,
    prefix_length,streaming,input_tokens,output_tokens,text_tokens,image_tokens,audio_tokens,
    video_tokens,reason_ratio,model,deadline_us,[slo_target_us,]server_input_tokens,arrival_time_us,
    send_time_us,first_chunk_time_us,last_chunk_time_us,num_chunks,status,error_message,
    finish_reason[,x_request_id][,adapter]

Columns are found by name, so older v2 files (without prefix_length, model, deadline_us,
server_input_tokens, finish_reason) and the optional columns read the same. Times are
integer microseconds. In ``real`` mode ``arrival_time_us`` is the workload's scheduled
arrival (from 0) and the three ``*_time_us`` columns are the client's epoch clock: send,
first and last SSE chunk. ``input_tokens`` is the prompt without its shared prefix
(``prefix_length`` tokens); ``server_input_tokens`` the server's ``prompt_tokens`` (0:
not recorded). BLIS itself computes TTFT = first chunk - send and E2E = last chunk - send.

What the BLIS header does not carry: ``max_num_batched_tokens``, and ``blis observe`` fills
only ``server.type`` and ``server.model`` (the engine fields appear when another tool writes
them). Per-request queue wait is not recorded (client-side timings only).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from schemas.metrics import tpot_s
from schemas.validate import MAX_TOKENS

from ..errors import TraceFormatError
from .blis_header import blis_file_pair, read_blis_header
from ._csv import csv_header, stream_csv
from ._frame import assemble_frame
from ._rows import RowStatus, check_rows
from ._source import Progress

__all__ = ["import_blis_observe"]

_REQUIRED = {"request_id": pa.int64(), "input_tokens": pa.int64(), "output_tokens": pa.int64(),
             "arrival_time_us": pa.int64(), "send_time_us": pa.int64(), "first_chunk_time_us": pa.int64(),
             "last_chunk_time_us": pa.int64(), "status": pa.string()}
_OPTIONAL = {"prefix_length": pa.int64(), "server_input_tokens": pa.int64(), "streaming": pa.string(),
             "slo_class": pa.string(), "prefix_group": pa.string(), "slo_target_us": pa.int64(),
             "vllm_priority": pa.int64(), "gie_priority": pa.int64(), "error_message": pa.string()}
_STRINGS = ("status", "streaming", "slo_class", "prefix_group", "error_message")
#: Go's strconv.ParseBool spellings.
_TRUE, _FALSE = {"1", "t", "T", "TRUE", "true", "True"}, {"0", "f", "F", "FALSE", "false", "False"}
#: Timestamps must stay below this (2**62 us, ~146,000 years), so differences fit int64.
_MAX_US = 2 ** 62
#: Longest prompt whose prefix-cache blocks are derived (one hash per block: 2**23 tokens is 524,288
#: hashes, about a second), above any model's context today.
_MAX_HASHED_PROMPT = 2 ** 23
#: A send later than its scheduled arrival by more than this is reported (the client held it back).
_LATE_SEND_S = 0.1


def _read_csv(path: Path, progress: Progress | None) -> dict[str, np.ndarray]:
    """Every wanted column present, as numpy arrays (strings: object arrays with None)."""
    header = csv_header(path)
    types = {**_REQUIRED, **{c: t for c, t in _OPTIONAL.items() if c in header}}
    parts: dict[str, list] = {c: [] for c in types}
    for _, batch in stream_csv(path, types, progress=progress, allow_null=_STRINGS[1:]):
        for c, col in zip(types, batch.columns):
            parts[c].append(col.to_numpy(zero_copy_only=False))
    return {c: (np.concatenate(v) if v else np.zeros(0, object if c in _STRINGS else np.int64))
            for c, v in parts.items()}


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big", signed=True)


def _prefix_hashes(groups, prefix_len, prompt, ids, block: int) -> np.ndarray:
    """block_hashes: ``prefix_len // block`` blocks shared by the rows of a prefix group, the rest
    unique to the request; None for rows without a group."""
    out = np.empty(len(prompt), dtype=object)
    for i, g in enumerate(groups):
        if not g:
            continue
        shared = min(int(prefix_len[i]), int(prompt[i])) // block
        out[i] = np.array([_hash(f"{g}\x00{k}") for k in range(shared)]
                          + [_hash(f"\x01{ids[i]}\x00{k}") for k in range(shared, int(prompt[i]) // block)], np.int64)
    return out


def import_blis_observe(path: str | Path, data: str | Path | None = None, invalid: str = "error",
                        progress: Progress | None = None) -> tuple[pd.DataFrame, dict]:
    """Read a BLIS TraceV2 pair (header YAML + data CSV) as a request trace.

    Parameters
    ----------
    path : str or Path
        The header YAML (or the CSV; see :func:`blis_file_pair`).
    data : str or Path, optional
        The data CSV; default the file of the same name ending in ``.csv``.
    invalid : {"error", "flag", "drop"}
        An ``ok`` row whose chunk times go backwards (send <= first chunk <= last chunk),
        that has no send time (``real`` mode), 0 output tokens, or a prompt of 0 tokens.
    progress : callable, optional

    Returns
    -------
    frame : pandas.DataFrame
        One row per CSV row, sorted by arrival; all times float64 seconds:

        * ``request_id`` = ``request_id``.
        * ``arrival_time_s`` = ``send_time_us`` minus the earliest, / 1e6: when the server was
          sent the request. A request never sent (``real`` mode, failed, send 0) is placed at
          its scheduled ``arrival_time_us`` on the same clock (shifted by the smallest
          send - arrival of the sent ones).
        * ``ttft_s`` = (first_chunk - send) / 1e6, ``e2e_s`` = (last_chunk - send) / 1e6, as
          BLIS computes them, client side (network included); ``tpot_s`` = (E2E - TTFT) / (N - 1).
          A non-streaming request (``streaming`` false) has no TTFT (its first chunk is the whole
          response): ``ttft_s`` and ``tpot_s`` are NaN. Failed rows have no latencies.
        * ``num_prompt_tokens`` = ``server_input_tokens`` when > 0, else ``input_tokens +
          prefix_length``; ``num_output_tokens`` = ``output_tokens``.
        * ``slo_ttft_s`` = ``slo_target_us`` / 1e6, else the class's ``ttft_ms`` / 1e3 of the
          header's ``goodput_slo_targets`` (v3); ``slo_tpot_s`` = the class's ``itl_ms`` / 1e3
          (BLIS's mean inter-chunk latency); only when some row has one. ``priority`` =
          ``vllm_priority`` (or ``gie_priority``) when present; ``slo_class`` when any is set.
        * ``block_hashes`` when some row has a ``prefix_group``: ``prefix_length // B`` blocks
          shared by the group, the rest unique (B = header ``block_size``, else 16).
        * ``status``: ``failed: <status>: <error_message>`` for a status other than ``ok``.

    metadata : dict
        Those of :func:`read_blis_header`, ``source_format``, ``source`` (the CSV),
        ``trace_header``, ``time_origin_unix_s`` (``real`` mode: the epoch of arrival 0),
        ``num_warm_up_rows`` (rows with ``request_id < warm_up_requests``, which BLIS's
        calibrate leaves out; kept here), ``prompt_tokens_source``, ``hash_block_tokens``,
        ``arrival_vs_send_warning`` (requests sent more than 0.1 s after their schedule).

    Raises
    ------
    TraceFormatError
        Naming the file, row, line and column: a bad header (:func:`read_blis_header`), a
        missing CSV column, a value that is not a 64-bit integer, a negative count or time,
        a ``streaming`` cell that is not a boolean, a duplicate ``request_id``, an invalid
        row under ``invalid="error"``.
    """
    head_path, path = blis_file_pair(path, data)
    head, meta = read_blis_header(head_path)
    real = head["mode"] == "real"
    c = _read_csv(path, progress)
    n = len(c["request_id"])
    if n == 0:
        raise TraceFormatError(path, "has no requests", expected="a header line, then one row per request")
    streaming = _checked_values(path, c, n)
    ids = c["request_id"]
    ok = c["status"] == "ok"
    arrival = _arrival_times(c, ok, real, meta)
    prefix = c.get("prefix_length", np.zeros(n, np.int64))
    prompt = c["input_tokens"] + prefix
    if "server_input_tokens" in c:
        prompt = np.where(c["server_input_tokens"] > 0, c["server_input_tokens"], prompt)
        meta["prompt_tokens_source"] = (f"server_input_tokens: {int((c['server_input_tokens'] > 0).sum())}, "
                                        f"input_tokens + prefix_length: {int((c['server_input_tokens'] <= 0).sum())}")
    else:
        meta["prompt_tokens_source"] = "input_tokens + prefix_length" if "prefix_length" in c else "input_tokens"
    output = c["output_tokens"]
    status = RowStatus(path, invalid, lines=True)
    codes = _status_codes(status, c, ok, real, prompt)
    status.add(codes, 0)
    good = codes == 0
    send, first, last = c["send_time_us"], c["first_chunk_time_us"], c["last_chunk_time_us"]
    ttft = np.where(good & streaming, (first - send) / 1e6, np.nan)
    e2e = np.where(good, (last - send) / 1e6, np.nan)
    extra = {"ttft_s": ttft, "e2e_s": e2e, "tpot_s": tpot_s(ttft, e2e, output)}
    _add_slo_columns(c, n, meta, extra)
    groups = c.get("prefix_group")
    if groups is not None and any(groups):
        block = json.loads(meta.get("engine_settings", "{}")).get("block_size", 16)
        grouped = np.array([bool(g) for g in groups])
        check_rows(path, grouped & (prompt > _MAX_HASHED_PROMPT), 0, "prompt too long to derive its prefix-cache "
                   "blocks", column="input_tokens", expected=f"<= {_MAX_HASHED_PROMPT:,} tokens in a prefix_group",
                   lines=True)
        extra["block_hashes"] = _prefix_hashes(groups, prefix, prompt, ids, block)
        meta["hash_block_tokens"] = str(block)
    warm = int(meta["warm_up_requests"])
    meta.update({"source_format": "blis-observe", "source": str(path), "trace_header": str(head_path),
                 "num_warm_up_rows": str(int((ids < warm).sum())),
                 "arrival_source": "send_time_us (client send), relative to the first"})
    df, m = assemble_frame(arrival, prompt, output, status=status, codes=codes,
                           request_ids=pa.array(ids).cast(pa.string()), extra=extra)
    return df, {**meta, **m}


def _checked_values(path: Path, c: dict[str, np.ndarray], n: int) -> np.ndarray:
    """Refuse a count or time out of range, a ``streaming`` cell that is not a boolean and a duplicate
    ``request_id``; return whether each request streamed (True where ``streaming`` is absent)."""
    for col in ("request_id", "input_tokens", "output_tokens", "prefix_length", "server_input_tokens",
                "arrival_time_us", "send_time_us", "first_chunk_time_us", "last_chunk_time_us", "slo_target_us",
                "vllm_priority", "gie_priority"):
        if col in c:
            top = (_MAX_US if col.endswith("_us") else
                   MAX_TOKENS + 1 if col.endswith("_tokens") or col == "prefix_length" else 2 ** 62)
            check_rows(path, (c[col] < 0) | (c[col] >= top), 0, "value is negative or too large", column=col,
                       expected=f"a whole number in [0, {top})", lines=True)
    streaming = np.ones(n, bool)
    if "streaming" in c:
        s = c["streaming"]
        bad = np.array([v is not None and v not in _TRUE and v not in _FALSE for v in s], bool)
        check_rows(path, bad, 0, "value is not a boolean", column="streaming", expected="true or false", lines=True)
        streaming = np.array([v not in _FALSE for v in s], bool)
    dup = pd.Series(c["request_id"]).duplicated().to_numpy()
    check_rows(path, dup, 0, "duplicate request_id", column="request_id", expected="unique ids", lines=True)
    return streaming


def _arrival_times(c: dict[str, np.ndarray], ok: np.ndarray, real: bool, meta: dict) -> np.ndarray:
    """The arrival times, seconds from the first: the send times, a request never sent at its schedule
    (shifted onto the send clock); in ``meta`` the epoch origin and a warning for requests sent late."""
    send, sched = c["send_time_us"], c["arrival_time_us"]
    unsent = (send == 0) & ~ok & real
    sent = ~unsent
    offset = int(np.min(send[sent] - sched[sent])) if real and sent.any() else 0
    t_us = np.where(sent, send, sched + offset)
    origin = int(t_us.min())
    if real and sent.any():
        meta["time_origin_unix_s"] = repr(origin / 1e6)
        late = (send - (sched + offset)) / 1e6
        late[unsent] = 0
        if late.max() > _LATE_SEND_S:
            k = int(np.argmax(late))
            meta["arrival_vs_send_warning"] = (
                f"{int((late > _LATE_SEND_S).sum())} request(s) were sent more than {_LATE_SEND_S:g} s after their "
                f"scheduled arrival (the client held them back, e.g. --max-concurrency); arrival_time_s is the send "
                f"time; largest: request {int(c['request_id'][k])} by {late[k]:.3f} s")
    return (t_us - origin) / 1e6


def _status_codes(status: RowStatus, c: dict[str, np.ndarray], ok: np.ndarray, real: bool,
                  prompt: np.ndarray) -> np.ndarray:
    """Each row's status code: an ``ok`` row breaking a rule is invalid (the first rule broken wins), a
    status other than ``ok`` is ``failed: <status>: <error_message>``."""
    n = len(ok)
    send, first, last = c["send_time_us"], c["first_chunk_time_us"], c["last_chunk_time_us"]
    codes = np.zeros(n, np.int16)
    rules = [(ok & real & (send == 0), "ok without a send time", "send_time_us",
              "the client's epoch send time (mode real)"),
             (ok & ((first < send) | (last < first)), "chunk times out of order", "first_chunk_time_us",
              "send_time_us <= first_chunk_time_us <= last_chunk_time_us"),
             (ok & (c["output_tokens"] == 0), "ok with 0 output tokens", "output_tokens", ">= 1 token"),
             (prompt < 1, "prompt of 0 tokens", "input_tokens", ">= 1 prompt token")]
    for mask, rule, col, expected in reversed(rules):  # the first rule broken wins
        codes[mask] = status.invalid(rule, col, expected)
    for i in np.flatnonzero(~ok & (codes == 0)):
        msg = (c.get("error_message", [None] * n)[i] or "").strip().splitlines()
        codes[i] = status.failed(f"{c['status'][i] or 'unknown'}" + (f": {msg[-1][:100]}" if msg else ""))
    return codes


def _add_slo_columns(c: dict[str, np.ndarray], n: int, meta: dict, extra: dict) -> None:
    """Add to ``extra`` the SLOs (the row's target, else its class's of the header), the priority and
    the SLO class, those the file has."""
    cls = c.get("slo_class", np.full(n, None, object))
    targets = json.loads(meta.get("goodput_slo_targets", "{}"))
    slo_ttft = np.array([targets.get(k or "", {}).get("ttft_ms", 0) / 1e3 or np.nan for k in cls], float)
    slo_tpot = np.array([targets.get(k or "", {}).get("itl_ms", 0) / 1e3 or np.nan for k in cls], float)
    if "slo_target_us" in c:
        slo_ttft = np.where(c["slo_target_us"] > 0, c["slo_target_us"] / 1e6, slo_ttft)
    for name, v in (("slo_ttft_s", slo_ttft), ("slo_tpot_s", slo_tpot)):
        if np.isfinite(v).any():
            extra[name] = v
    for col in ("vllm_priority", "gie_priority"):
        if col in c:
            extra["priority"] = c[col]
            meta["priority_source"] = col
            break
    if any(cls):
        extra["slo_class"] = cls
