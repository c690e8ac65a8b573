"""The fields a column mapping (``--map SOURCE=FIELD``) may name, and parsing a mapping."""
from __future__ import annotations

from ...errors import MappingError

INSTANTS = ("arrival_time_s", "send_time", "scheduled_time", "first_token_time", "end_time")

DURATIONS = ("queue_wait_s", "ttft_s", "tpot_s", "e2e_s", "slo_ttft_s", "slo_tpot_s")

INTEGERS = ("num_prompt_tokens", "num_output_tokens", "num_cached_tokens", "replica_id", "priority")

STRINGS = ("request_id", "status")

#: Every field ``--map`` may name.
FIELDS = (*STRINGS, *INTEGERS, *INSTANTS, *DURATIONS)

#: Instant -> the latency it yields (instant minus send time).
LATENCY_OF = {"scheduled_time": "queue_wait_s", "first_token_time": "ttft_s", "end_time": "e2e_s"}


def parse_mapping(pairs) -> dict[str, str]:
    """``["src=field", ...]`` -> ``{field: src}``.

    Raises
    ------
    MappingError
        Not ``SOURCE=FIELD``, an unknown field, a field mapped twice, a latency given both
        as an instant and as a duration, or no prompt/output/arrival mapping.
    """
    out: dict[str, str] = {}
    for p in pairs:
        src, sep, fld = str(p).rpartition("=")
        src, fld = src.strip(), fld.strip()
        if not sep or not src or not fld:
            raise MappingError(f"--map {p!r}: expected SOURCE_COLUMN=FIELD")
        if fld not in FIELDS:
            raise MappingError(f"--map {p!r}: unknown field {fld!r}; fields: {', '.join(FIELDS)}")
        if fld in out:
            raise MappingError(f"--map: field {fld!r} is mapped twice ({out[fld]!r} and {src!r})")
        out[fld] = src
    for inst, dur in LATENCY_OF.items():
        if inst in out and dur in out:
            raise MappingError(f"--map: {dur} is given twice, as the duration {out[dur]!r} and through the instant "
                               f"{inst} {out[inst]!r}; map one")
    missing = [f for f in ("num_prompt_tokens", "num_output_tokens") if f not in out]
    if "arrival_time_s" not in out and "send_time" not in out:
        missing.append("arrival_time_s or send_time")
    if missing:
        raise MappingError(f"--map: no column mapped to {', '.join(missing)}")
    return out
