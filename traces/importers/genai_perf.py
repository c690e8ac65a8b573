"""Import GenAI-Perf / Perf Analyzer ``profile_export.json`` (per-request timestamps).

Format (triton-inference-server/client (now perf_analyzer), ``genai-perf/docs/files.md``
and ``genai_perf/profile_data_parser``; written by Perf Analyzer with
``--profile-export-file``)::

    {"service_kind": "openai", "endpoint": "v1/chat/completions",
     "experiments": [
       {"experiment": {"mode": "concurrency", "value": 10},
        "requests": [
          {"timestamp": 1715299200000000000,
           "request_inputs": {"payload": "{...}"},
           "response_timestamps": [..., ...],
           "response_outputs": [{"response": "data: {...choices:[{delta:{content:...}}]}\\n\\n"},
                                ..., {"response": "data: [DONE]\\n\\n"}]}]}]}

``timestamp`` and ``response_timestamps`` are nanoseconds (integers on one clock). A
streamed response may carry no content (the role chunk, a usage-only chunk, ``[DONE]``);
like GenAI-Perf, only content-bearing responses count as tokens arriving. Triton responses
use ``{"text_output": ...}``. Token counts are not in the file (GenAI-Perf re-tokenises
the text): this importer takes them from ``usage`` (``prompt_tokens``,
``completion_tokens``) when the server sent it, else counts one output token per content
response, and needs ``prompt_tokens`` from the caller.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from schemas.metrics import tpot_s

from ..errors import TraceFormatError
from ._frame import assemble_frame
from ._json import json_number, read_json
from ._rows import RowStatus

__all__ = ["import_genai_perf"]


def _response_info(resp) -> tuple[bool, dict | None, str | None]:
    """(has content, usage, error) of one entry of ``response_outputs``."""
    if not isinstance(resp, dict):
        return bool(resp), None, None
    if "text_output" in resp:
        return bool(resp["text_output"]), None, None
    if "response" not in resp:
        return any(bool(v) for v in resp.values()), None, None
    text = resp["response"]
    if not isinstance(text, str):
        return bool(text), None, None
    content, usage, error = False, None, None
    events = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")] or [text.strip()]
    for ev in events:
        if not ev or ev == "[DONE]":
            continue
        try:
            data = json.loads(ev)
        except (ValueError, RecursionError):  # not JSON (or absurd JSON): text content
            content = True
            continue
        if not isinstance(data, dict):
            continue
        if data.get("error"):
            error = str(data["error"].get("message", data["error"]) if isinstance(data["error"], dict)
                        else data["error"])
        if isinstance(data.get("usage"), dict):
            usage = data["usage"]
        for ch in data.get("choices") or []:
            if not isinstance(ch, dict):
                continue
            delta = ch.get("delta") if isinstance(ch.get("delta"), dict) else {}
            msg = ch.get("message") if isinstance(ch.get("message"), dict) else {}
            if ch.get("text") or delta.get("content") or delta.get("reasoning_content") or msg.get("content"):
                content = True
    return content, usage, error


def import_genai_perf(path: str | Path, experiment: int | None = None, prompt_tokens: int | None = None,
                      invalid: str = "error") -> tuple[pd.DataFrame, dict]:
    """Read one experiment of a ``profile_export.json``.

    Parameters
    ----------
    path : str or Path
    experiment : int, optional
        1-based experiment (load level) to read; needed when the file holds several.
    prompt_tokens : int, optional
        Prompt length for requests whose responses carry no ``usage`` (runs with a fixed
        synthetic input length, ``--synthetic-input-tokens-stddev 0``).
    invalid : {"error", "flag", "drop"}
        Policy for a request whose ``response_timestamps`` go backwards.

    Returns
    -------
    frame : pandas.DataFrame
        ``arrival_time_s`` = request ``timestamp`` minus the first, in int64 ns then
        seconds. ``token_times_s`` = content response timestamps minus the request's (one
        per output token when each response carries one token; null when ``usage`` says
        more tokens than content responses). ``ttft_s`` = first, ``e2e_s`` = last of
        them; ``tpot_s`` = (E2E - TTFT)/(N - 1). A request without content responses or
        with an error is kept with ``status = 'failed: ...'``. ``request_id`` = 1-based
        position in the experiment.
    metadata : dict
        Experiment mode and value, ``output_tokens_source``, ``prompt_tokens_source``.

    Raises
    ------
    TraceFormatError
        Not the format; several experiments and no ``experiment``; a missing field; a
        timestamp that is not an integer; no prompt token count.
    """
    path = Path(path)
    obj = read_json(path)
    experiment, exp, reqs = _experiment(path, obj, experiment)
    n = len(reqs)
    status = RowStatus(path, invalid)
    c_order = status.invalid("response_timestamps before the request timestamp or out of order",
                             "response_timestamps", "non-decreasing timestamps after the request's")
    send = np.zeros(n, np.int64)
    prompt, output = np.zeros(n, np.int64), np.zeros(n, np.int64)
    ttft, e2e = np.full(n, np.nan), np.full(n, np.nan)
    token_times = np.empty(n, dtype=object)
    codes = np.zeros(n, np.int16)
    used_usage_out = used_chunks_out = used_usage_in = used_option_in = 0
    for i, req in enumerate(reqs):
        r = i + 1
        if not isinstance(req, dict):
            raise TraceFormatError(path, f"request is a JSON {type(req).__name__}", row=r, expected="an object")
        if "timestamp" not in req:
            raise TraceFormatError(path, "missing field", row=r, column="timestamp")
        send[i] = json_number(path, req["timestamp"], column="timestamp", row=r, integer=True, minimum=0)
        usage, error, content_ts = _responses(path, req, r)
        n_in = usage.get("prompt_tokens") if usage else None
        if n_in is None and prompt_tokens is None:
            raise TraceFormatError(path, "no prompt token count (the responses carry no 'usage')", row=r,
                                   column="prompt_tokens",
                                   expected="--prompt-tokens N when the run used a fixed input length")
        used_usage_in += n_in is not None
        used_option_in += n_in is None
        prompt[i] = json_number(path, prompt_tokens if n_in is None else n_in, column="prompt_tokens", row=r,
                                integer=True, minimum=1)
        if error or not content_ts:
            codes[i] = status.failed(error[:100] if error else "no content in the responses")
            continue
        rel = np.asarray(content_ts, np.int64) - send[i]
        if rel[0] < 0 or np.any(np.diff(rel) < 0):
            codes[i] = c_order
            continue
        n_out = usage.get("completion_tokens") if usage else None
        used_usage_out += n_out is not None
        used_chunks_out += n_out is None
        output[i] = json_number(path, len(content_ts) if n_out is None else n_out, column="completion_tokens",
                                row=r, integer=True, minimum=1)
        sec = rel / 1e9
        ttft[i], e2e[i] = sec[0], sec[-1]
        if len(sec) == output[i]:
            token_times[i] = sec
    status.add(codes, 0)
    arrival = (send - send.min()) / 1e9
    df, meta = assemble_frame(arrival, prompt, output, status=status, codes=codes,
                              extra={"ttft_s": ttft, "e2e_s": e2e, "tpot_s": tpot_s(ttft, e2e, output),
                                     "token_times_s": token_times})
    info = exp.get("experiment") if isinstance(exp.get("experiment"), dict) else {}
    meta.update({
        "source_format": "genai-perf",
        "source": str(path),
        "experiment": str(experiment),
        "experiment_mode": str(info.get("mode", "")),
        "experiment_value": str(info.get("value", "")),
        "service_kind": str(obj.get("service_kind", "")),
        "endpoint": str(obj.get("endpoint", "")),
        "arrival_source": "recorded: request timestamp (ns) relative to the first",
        "output_tokens_source": f"usage.completion_tokens for {used_usage_out}, "
                                f"one token per content response for {used_chunks_out}",
        "prompt_tokens_source": f"usage.prompt_tokens for {used_usage_in}, --prompt-tokens for {used_option_in}",
    })
    return df, meta


def _experiment(path: Path, obj, experiment: int | None) -> tuple[int, dict, list]:
    """The 1-based index, the object and the requests of the chosen experiment (default: the only one)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("experiments"), list):
        raise TraceFormatError(path, "has no 'experiments' list", column="experiments",
                               expected="a Perf Analyzer / GenAI-Perf profile_export.json")
    exps = obj["experiments"]
    if not exps:
        raise TraceFormatError(path, "has no experiments", column="experiments")
    if experiment is None:
        if len(exps) > 1:
            raise TraceFormatError(path, f"has {len(exps)} experiments", column="experiments",
                                   expected="--experiment N (1-based) to pick one")
        experiment = 1
    if not 1 <= experiment <= len(exps):
        raise TraceFormatError(path, f"experiment {experiment} is out of range", expected=f"1..{len(exps)}")
    exp = exps[experiment - 1]
    reqs = exp.get("requests") if isinstance(exp, dict) else None
    if not isinstance(reqs, list) or not reqs:
        raise TraceFormatError(path, f"experiment {experiment} has no requests", column="requests")
    return experiment, exp, reqs


def _responses(path: Path, req: dict, r: int) -> tuple[dict | None, str | None, list[int]]:
    """Request ``req``'s (row ``r``) last usage, first error and the timestamps (ns) of its responses
    with content."""
    rts = req.get("response_timestamps") or []
    if not isinstance(rts, list):
        raise TraceFormatError(path, "response_timestamps is not a list", row=r, column="response_timestamps")
    rts = [json_number(path, v, column="response_timestamps", row=r, integer=True, minimum=0) for v in rts]
    outs = req.get("response_outputs")
    if isinstance(outs, list) and len(outs) == len(rts):
        infos = [_response_info(o) for o in outs]
    else:
        infos = [(True, None, None)] * len(rts)
    usage = next((u for _, u, _ in reversed(infos) if u), None)
    error = next((e for _, _, e in infos if e), None)
    return usage, error, [t for t, (c, _, _) in zip(rts, infos) if c]
