"""A request trace's rows as the engine takes them, read from the frame once for any number of replays.

:func:`replay.simulate.replay_frame` builds one per call from a frame; a caller replaying one trace
many times (a fit: hundreds of replays with other parameters) builds it once and passes it instead,
which also keeps the prompts' block keys (:func:`~replay.core.prompt_keys.prompt_block_keys`) for the
next replays.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from schemas.status import OK

from .prompt_keys import prompt_block_keys
from .request import Request


class TraceRequests:
    """The columns of a request trace the engine reads, as Python lists (read once).

    Parameters
    ----------
    frame : pandas.DataFrame
        A validated request trace (``request_trace/1`` columns: seconds, tokens), sorted by
        arrival time. Not copied: it must not change while this object is used.
    keep_prompt_keys : bool
        Keep the prompts' block keys, once computed for a block geometry, for the next replays
        (a trace replayed many times); memory: every prompt's keys at once (one int per full
        KV block), so not for a one-off replay of a large trace.

    Attributes
    ----------
    frame : pandas.DataFrame
    num_rows : int
    num_output_tokens : numpy.ndarray of int64, shape (num_rows,)
    """

    def __init__(self, frame: pd.DataFrame, keep_prompt_keys: bool = False):
        n = self.num_rows = len(frame)
        self.frame, self.keep_prompt_keys = frame, keep_prompt_keys
        self._ids = frame["request_id"].astype(str).tolist()
        self._arrival_s = frame["arrival_time_s"].to_numpy(float)
        self._prompt_tokens = frame["num_prompt_tokens"].to_numpy(np.int64).tolist()
        self.num_output_tokens = frame["num_output_tokens"].to_numpy(np.int64)
        self._output_tokens = self.num_output_tokens.tolist()
        self._priority = frame["priority"].to_numpy(np.int64).tolist() if "priority" in frame else [0] * n
        self._hashes = frame["block_hashes"].tolist() if "block_hashes" in frame else [None] * n
        self._kept = [True] * n
        if "status" in frame:
            status = frame["status"]
            self._kept = (status.isna() | (status == OK)).tolist()
        # per row, the SLO the trace gives (NaN: none), by column
        self._slo_s = {col: pd.to_numeric(frame[col], errors="coerce").to_numpy(float)
                       for col in ("slo_ttft_s", "slo_tpot_s") if col in frame}
        self._prompt_keys: dict[tuple[int, int], list[list[int]]] = {}

    def __reduce__(self):
        """Pickled as the frame: a worker reads the columns again (and computes its own keys)."""
        return type(self), (self.frame, self.keep_prompt_keys)

    def prompt_keys(self, block_size: int, hash_block_size: int) -> list[list[int]]:
        """Per row, the block keys of its prompt (:func:`~replay.core.prompt_keys.prompt_block_keys`)
        with ``block_size``-token KV blocks over ``hash_block_size``-token hash blocks; computed
        once per geometry and kept."""
        geometry = (block_size, hash_block_size)
        keys = self._prompt_keys.get(geometry)
        if keys is None:
            keys = self._prompt_keys[geometry] = [prompt_block_keys(h, p, block_size, hash_block_size)
                                                  for h, p in zip(self._hashes, self._prompt_tokens)]
        return keys

    def requests(self, record_token_times: bool = False, slo_ttft_s: float | None = None,
                 slo_tpot_s: float | None = None, frontend_s: np.ndarray | None = None,
                 block_geometry: tuple[int, int] | None = None) -> list[Request]:
        """Fresh engine requests of the rows, in row order.

        Rows whose ``status`` is set and not ``ok`` (failed in the measured run) are not simulated.
        A request's SLOs are its row's ``slo_ttft_s``/``slo_tpot_s`` where given, else the
        ``slo_ttft_s``/``slo_tpot_s`` arguments, else none (``inf``). ``frontend_s`` (seconds,
        one per row) delays each request's arrival at the engine (the API server's time).
        ``block_geometry`` ``(block_size, hash_block_size)``, tokens: give each request its
        prompt's block keys (:meth:`prompt_keys`) when they are kept; None (no prefix caching):
        none.
        """
        n = self.num_rows
        arr = (self._arrival_s if frontend_s is None else self._arrival_s + frontend_s).tolist()
        slos = []
        for col, default in (("slo_ttft_s", slo_ttft_s), ("slo_tpot_s", slo_tpot_s)):
            v = np.full(n, np.inf if default is None else float(default))
            given = self._slo_s.get(col)
            if given is not None:
                v = np.where(np.isnan(given), v, given)
            slos.append(v.tolist())
        keys = (self.prompt_keys(*block_geometry) if block_geometry is not None and self.keep_prompt_keys
                else [None] * n)
        # positional arguments: measurably cheaper than keywords a million times over
        return [Request(i, rid, t, p, o, pr, math.inf, h, record_token_times, s_ttft, s_tpot, k)
                for i, rid, t, p, o, pr, h, s_ttft, s_tpot, k, kept
                in zip(range(n), self._ids, arr, self._prompt_tokens, self._output_tokens, self._priority,
                       self._hashes, slos[0], slos[1], keys, self._kept) if kept]
