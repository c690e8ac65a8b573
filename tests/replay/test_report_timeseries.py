"""The measured time series a replay report draws beside the simulation (``--measured-timeseries``,
replay.report): how a CSV of ticks is read, every way reading one fails, and its span against the
trace's."""
import re

import numpy as np
import pandas as pd
import pytest

from helpers import write_content
from replay.errors import TimeseriesError
from replay.report import check_timeseries_span, read_timeseries


def test_read_timeseries_errors(tmp_path):
    p = tmp_path / "ts.csv"
    p.write_text("t,running\n1.0,3\n")
    with pytest.raises(TimeseriesError, match=r"ts\.csv: missing column\(s\) waiting"):
        read_timeseries(p)
    p.write_text("t,running,waiting\n1.0,3,0\n2.0,x,1\n")
    with pytest.raises(TimeseriesError, match=r"column 'running', line 3: 'x'"):
        read_timeseries(p)
    with pytest.raises(TimeseriesError, match="no such file"):
        read_timeseries(tmp_path / "absent.csv")
    p.write_text("t,prompt_throughput,running,waiting\n2.0,5.0,4,1\n1.0,9.0,3,0\n")
    ts = read_timeseries(p)
    assert ts["t"].tolist() == [1.0, 2.0] and ts["running"].tolist() == [3, 4]


@pytest.mark.parametrize("name,content,message", [
    ("h.csv", "t,running,waiting\n", r"h\.csv: has no rows; expected one row per tick \(t, running, waiting\)"),
    ("x.csv.gz", "t,running,waiting\n1,2,3\n", r"x\.csv\.gz: not a CSV time series \(Not a gzipped file"),
    ("x.zip", "t,running,waiting\n1,2,3\n", r"x\.zip: not a CSV time series \(File is not a zip file\)"),
    ("x.csv.bz2", "t,running,waiting\n1,2,3\n", r"x\.csv\.bz2: not a CSV time series \(Invalid data stream\)"),
    ("e.csv", "", r"e\.csv: not a CSV time series \(No columns to parse from file\); expected a CSV with columns "
                  r"t, running, waiting"),
    ("b.csv", b"t,running\n\xff\xfe,1\n", r"b\.csv: not a CSV time series \(not UTF-8 text\)"),
    ("d.csv", None, r"d\.csv: is a folder; expected a CSV file"),
])
def test_every_read_failure_of_a_timeseries_is_one_error(tmp_path, name, content, message):
    p = tmp_path / name
    write_content(p, content, missing="folder")
    with pytest.raises(TimeseriesError) as err:
        read_timeseries(p)
    assert re.search(message, " ".join(str(err.value).split())), str(err.value)  # folded at 100 columns


def test_a_compressed_timeseries_reads(tmp_path):
    import gzip

    with gzip.open(tmp_path / "ts.csv.gz", "wt") as fh:
        fh.write("t,running,waiting\n1.0,3,0\n2.0,4,1\n")
    assert read_timeseries(tmp_path / "ts.csv.gz")["running"].tolist() == [3, 4]


def test_timeseries_span_against_the_trace():
    trace = pd.DataFrame({"arrival_time_s": [0.0, 10.0, 20.0], "e2e_s": [5.0, 30.0, 12.5]})  # last end: 40 s
    def ts(t):
        return pd.DataFrame({"t": np.asarray(t, float), "running": 1.0, "waiting": 0.0})

    assert check_timeseries_span(ts(np.arange(1.0, 43.0)), "ts.csv", trace) is None  # up to 2 ticks after: inside
    warning = check_timeseries_span(ts(np.arange(1.0, 51.0)), "ts.csv", trace)
    assert warning == ("warning: ts.csv: 8 of 50 ticks (t 43 to 50 s) lie after the trace's span [0, 40.0] s; "
                       "they are compared with a simulation that has no request left there")
    with pytest.raises(TimeseriesError, match=r"ts\.csv: column 't': every tick \(1700000001 to 1700000050 s\) "
                                              r"lies outside the trace's span \[0, 40\.0\] s; expected seconds since "
                                              r"the trace's start"):
        check_timeseries_span(ts(1.7e9 + np.arange(1.0, 51.0)), "ts.csv", trace)
    # 10 s ticks: the slack is two of them; without e2e_s the span ends at the last arrival and
    # later ticks may be its drain (no warning), but a series wholly after it is still refused
    assert check_timeseries_span(ts([10.0, 20.0, 30.0, 40.0, 60.0]), "ts.csv", trace) is None
    arrivals = trace[["arrival_time_s"]]
    assert check_timeseries_span(ts(np.arange(1.0, 100.0)), "ts.csv", arrivals) is None
    with pytest.raises(TimeseriesError, match=r"\[0, 20\.0\] s"):
        check_timeseries_span(ts([100.0, 101.0]), "ts.csv", arrivals)


def test_real_vllm_timeseries_reads(real_data_dir):
    ts = read_timeseries(real_data_dir / "lss_vllm_rtxpro6000_llama31_8b_timeseries.csv")
    assert len(ts) > 60 and ts["running"].max() <= 128  # max_num_seqs of that run
