"""Properties (hypothesis) of the rules the fuzzer relies on: number checks never raise anything
but a TraceFormatError, and validation of token times accepts exactly the well-formed ones."""
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.errors import ValidationError
from schemas.tables import REQUEST_TRACE, to_table
from schemas.validate import validate
from traces.errors import TraceFormatError
from traces.importers._json import json_number

ANY_JSON_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 400), max_value=10 ** 400),
                            st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5))


@settings(max_examples=400, deadline=None)
@given(ANY_JSON_SCALAR, st.booleans(), st.one_of(st.none(), st.floats(-10, 10)))
def test_json_number_returns_a_checked_number_or_raises_trace_format_error(value, integer, minimum):
    try:
        out = json_number("f.json", value, column="c", row=1, integer=integer, minimum=minimum)
    except TraceFormatError as exc:
        assert str(exc).startswith("f.json, row 1, column 'c': ")
        return
    assert math.isfinite(out) and (minimum is None or out >= minimum)
    if integer:
        assert isinstance(out, int) and -2 ** 63 <= out < 2 ** 63
        np.int64(out)  # fits


times = st.lists(st.one_of(st.floats(min_value=-5, max_value=50), st.sampled_from([math.nan, math.inf, -math.inf])),
                 min_size=1, max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(times, st.floats(min_value=0, max_value=60))
def test_validate_accepts_exactly_well_formed_token_times(tt, e2e):
    e2e = max(e2e, 1e-3)
    df = pd.DataFrame({"request_id": ["a"], "arrival_time_s": [0.0], "num_prompt_tokens": [5],
                       "num_output_tokens": [len(tt)], "ttft_s": [min(1e-3, e2e)], "e2e_s": [e2e],
                       "token_times_s": [tt]})
    a = np.asarray(tt, float)
    good = bool(np.all(np.isfinite(a)) and np.all(a >= 0) and np.all(np.diff(a) >= 0)
                and a[-1] <= e2e + e2e * 1e-9 + 1e-9)
    table = to_table(REQUEST_TRACE, df)
    if good:
        validate(table, "t.parquet")
    else:
        with pytest.raises(ValidationError, match="token_times_s"):
            validate(table, "t.parquet")
