"""The status vocabulary of the contract, named once.

A request's ``status`` (``request_trace/1``) and ``pred_status`` (``replay_result/1``) is
:data:`OK` or ``"<kind>: <why>"`` (:func:`because`):

- ``failed: ...``: the source says the request failed; kept in the trace, never replayed;
- ``invalid: ...``: the row breaks a rule of its format (kept by ``--invalid flag``); replay
  and compare skip it;
- ``rejected: ...``: the replay could not admit it (longer than the model or the KV cache);
- ``not simulated: ...`` (``pred_status`` only): a request the replay left out.

While a replay runs, a request's state (``replay.core.request.Request.status``) is :data:`WAITING`,
:data:`RUNNING`, :data:`SWAPPED` or :data:`TRANSFERRING`, then :data:`OK` or a rejection.
"""
OK = "ok"
FAILED = "failed"
INVALID = "invalid"
REJECTED = "rejected"
NOT_SIMULATED = "not simulated"

WAITING = "waiting"
RUNNING = "running"
SWAPPED = "swapped"
TRANSFERRING = "transferring"


def because(kind: str, why: str) -> str:
    """The status ``"<kind>: <why>"``, e.g. ``because(REJECTED, "exceeds max_model_len")``."""
    return f"{kind}: {why}"
