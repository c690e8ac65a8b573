"""``traces import prometheus``: scrapes of vLLM / SGLang ``/metrics`` read as per-window increases,
levels of ``aggregate_targets/1``, and one clear error per kind of bad input (issue #32 item 1)."""
import json
from pathlib import Path

import numpy as np
import pytest

from helpers import flat, invoke_servecal
from traces.errors import TraceFormatError
from traces.importers.prometheus import import_prometheus
from traces.importers.prometheus_histograms import histogram_quantile as _quantile
from traces.io import read_trace

DATA = Path(__file__).parents[1] / "data"
SCRAPES = DATA / "vllm_metrics_scrapes.txt"  # 5 scrapes, 15 s apart, written by prometheus_client


def _value(df, level, metric, statistic, q=None, col="value_s"):
    rows = df[(df["level"] == level) & (df["metric"] == metric) & (df["statistic"] == statistic)]
    if q is not None:
        rows = rows[rows["quantile_pct"] == q]
    assert len(rows) == 1, (level, metric, statistic, q, rows)
    return float(rows[col].iloc[0])


def _parts(text: str) -> list[str]:
    return ["# scrape at" + p for p in text.split("# scrape at")[1:]]


def test_windows_are_levels_of_the_histograms_increases(tmp_path):
    out = tmp_path / "agg.parquet"
    res = invoke_servecal("traces", "import", "prometheus", SCRAPES, "--window-s", "30", "-o", out)
    assert res.exit_code == 0, res.output
    kind, df, meta = read_trace(out)
    assert kind == "aggregate_targets/1" and meta["engine"] == "vllm"
    # 60 s of scrapes in windows of 30 s: 0-30 (12 + 16 requests) and 30-60 (20 + 24)
    assert "2 level(s) (0-30 s, 30-60 s)" in flat(res.output)
    assert sorted(set(df["num_requests"])) == [28, 44]
    assert set(df["metric"]) == {"ttft_s", "e2e_s", "tpot_s", "num_prompt_tokens", "num_output_tokens"}
    assert _value(df, 0, "ttft_s", "quantile", 50) > 0
    windows = json.loads(meta["windows"])
    # arrivals: finished + increase of running + waiting (0 -> 6 + 1)
    assert windows[0]["arrived_requests"] == 28 + 7
    # and per scrape interval, from the window's start: what the synthesized arrivals are conditioned on
    counts = json.loads(meta["arrival_counts"])
    assert [c[:2] for c in counts["0"]] == [[0, 15], [15, 30]] and sum(c[2] for c in counts["0"]) == 28 + 7
    # and the requests held (running, waiting) at each scrape: the window's replay holds the first's and its arrivals
    held = json.loads(meta["requests_held"])
    assert held["0"][0] == [0, 0, 0] and held["0"][-1] == [30, 6, 1] and held["1"][0] == [0, 6, 1]
    assert meta["length_points"] == "bucket bounds"  # the synthesized lengths fill the buckets with the mean
    assert abs(df[df["level"] == 0]["level_value"].iloc[0] - 35 / 30) < 1e-9
    assert windows[0]["prefix_cache_hit_rate"] == pytest.approx(0.2)
    assert windows[1]["preemptions"] == 1 + 1  # the counter's increases at 45 and 60 s
    assert windows[0]["resolution_s"]["ttft_s"]["p50"] > 0


def test_quantile_interpolates_inside_its_bucket_as_histogram_quantile():
    cum = [(1.0, 10.0), (2.0, 30.0), (float("inf"), 40.0)]
    assert _quantile(cum, 25.0) == (0.1 * 10 / 1.0, 1.0)  # rank 10 at the top of the first bucket: 1.0
    assert _quantile(cum, 50.0) == (1.5, 1.0)
    assert _quantile(cum, 99.0)[0] == 2.0  # the +Inf bucket: the highest finite bound


def test_percentiles_inside_a_bucket_have_the_exact_mean(tmp_path):
    """1,000 TPOTs at the quantiles of a density ∝ exp(-(x - 25 ms) / 8 ms) on vLLM's 25-50 ms
    bucket (scipy's truncexpon): every one in that bucket, their mean the density's. Linear
    interpolation (histogram_quantile) reads p50 37.5 ms and p90 47.5 ms; the import reads the
    density's own percentiles, scipy's truncexpon.ppf."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest
    from scipy import stats

    from traces.importers.prometheus_histograms import histogram_percentiles

    d = stats.truncexpon(b=25 / 8, loc=25e-3, scale=8e-3)
    reg = CollectorRegistry()
    tpot = Histogram("vllm:request_time_per_output_token_seconds", "", buckets=(0.01, 0.025, 0.05, 0.075),
                     registry=reg)
    e2e = Histogram("vllm:e2e_request_latency_seconds", "", buckets=(1.0, 10.0), registry=reg)
    parts = [f"# scrape at 1718000000\n{generate_latest(reg).decode()}"]
    for v in d.ppf((np.arange(1000) + 0.5) / 1000):
        tpot.observe(v)
        e2e.observe(5.0)
    parts.append(f"# scrape at 1718000015\n{generate_latest(reg).decode()}")
    src = tmp_path / "scrapes.txt"
    src.write_text("".join(parts))
    df, meta = import_prometheus([src], window_s=60)
    assert _value(df, 0, "tpot_s", "mean") == pytest.approx(d.mean(), rel=1e-6)
    for q in (10, 50, 90):
        assert _value(df, 0, "tpot_s", "quantile", q) == pytest.approx(d.ppf(q / 100), rel=1e-5)
    assert json.loads(meta["windows"])[0]["resolution_s"]["tpot_s"]["p50"] == pytest.approx(0.025)
    # with an observation in the +Inf bucket, which no bound holds: histogram_quantile's values
    cum = [(0.025, 0.0), (0.05, 9.0), (float("inf"), 10.0)]
    assert histogram_percentiles(cum, 0.04, [50.0]) == [_quantile(cum, 50.0)]


def test_a_counter_reset_counts_from_zero_and_is_stated(tmp_path):
    parts = _parts(SCRAPES.read_text())
    # a restart between the 3rd and 4th scrape: the 4th and 5th counting from a fresh server
    fresh = _parts(SCRAPES.read_text())
    restarted = parts[:3] + [fresh[1].replace("1718000015", "1718000045"), fresh[2].replace("1718000030", "1718000060")]
    src = tmp_path / "scrapes.txt"
    src.write_text("".join(restarted))
    out = tmp_path / "agg.parquet"
    res = invoke_servecal("traces", "import", "prometheus", src, "--window-s", "60", "-o", out)
    assert res.exit_code == 0, res.output
    assert "counter reset" in flat(res.output)
    _, df, meta = read_trace(out)
    assert int(meta["counter_resets"]) > 0
    assert set(df["num_requests"]) == {12 + 16 + 12 + 16}


def test_a_folder_of_files_named_with_their_time(tmp_path):
    folder = tmp_path / "scrapes"
    folder.mkdir()
    for k, part in enumerate(_parts(SCRAPES.read_text())):
        (folder / f"metrics-{1718000000 + 15 * k}.txt").write_text(part.split("\n", 1)[1])
    df, meta = import_prometheus([folder], window_s=300)
    assert set(df["num_requests"]) == {12 + 16 + 20 + 24}


def test_query_range_export(tmp_path):
    series = {}
    for part in _parts(SCRAPES.read_text()):
        t = float(part.split("\n", 1)[0].split()[-1])
        for line in part.splitlines()[1:]:
            if line.startswith("#") or not line.strip():
                continue
            name_labels, value = line.rsplit(" ", 1)
            name, _, labels = name_labels.partition("{")
            metric = dict(kv.split("=", 1) for kv in labels.rstrip("}").split(",")) if labels else {}
            metric = {k: v.strip('"') for k, v in metric.items()}
            key = (name, tuple(sorted(metric.items())))
            series.setdefault(key, []).append([t, value])
    result = [{"metric": {"__name__": n, **dict(labels)}, "values": v} for (n, labels), v in series.items()]
    src = tmp_path / "range.json"
    src.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}))
    df, _ = import_prometheus([src], window_s=30)
    ref, _ = import_prometheus([SCRAPES], window_s=30)
    assert df.equals(ref)


def test_sglang_names_read_with_lengths_from_the_counters(tmp_path):
    text = SCRAPES.read_text().replace("vllm:", "sglang:")
    text = text.replace("sglang:num_requests_running", "sglang:num_running_reqs")
    text = "\n".join(s for s in text.splitlines() if "request_prompt_tokens" not in s)
    text = text.replace("sglang:prefix_cache_queries_total", "sglang:prompt_tokens_total")
    src = tmp_path / "sglang.txt"
    src.write_text(text + "\n")
    df, meta = import_prometheus([src], window_s=300)
    assert meta["engine"] == "sglang"
    assert set(df[df["metric"] == "num_prompt_tokens"]["statistic"]) == {"mean"}


def test_by_label_keeps_models_apart_and_mixing_them_is_refused(tmp_path):
    text = SCRAPES.read_text()
    other = text.replace("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B")
    parts = [a + b.split("\n", 1)[1] for a, b in zip(_parts(text), _parts(other))]
    src = tmp_path / "two.txt"
    src.write_text("".join(parts))
    with pytest.raises(TraceFormatError, match="series of 2 models"):
        import_prometheus([src], window_s=300)
    df, meta = import_prometheus([src], window_s=300, by_label="model_name")
    assert df["level"].nunique() == 2 and "model_name=Qwen/Qwen3-8B" in meta["levels"]


@pytest.mark.parametrize("edit, match", [
    (lambda t: t[:t.rindex("vllm:num_requests_waiting{") + 30], "line .*not the Prometheus text format"),
    (lambda t: "\n".join(s for s in t.splitlines() if 'le="+Inf"' not in s or "ttft" in s) + "\n",
     'has no le="\\+Inf" bucket'),
    (lambda t: t.replace("vllm:", "foo:"), "no vLLM or SGLang request histogram"),
    (lambda t: t.replace("# scrape at 1718000015", "# scrape at soon"), "is not a unix time"),
    (lambda t: t.replace("# scrape at 1718000015", "# scrape at 1718000000"), "a second scrape"),
    (lambda t: "\n".join(s for s in t.splitlines() if not s.startswith("# scrape at")) + "\n", "no scrape time"),
])
def test_bad_input_is_one_error_naming_the_file(tmp_path, edit, match):
    src = tmp_path / "bad.txt"
    src.write_text(edit(SCRAPES.read_text()))
    out = tmp_path / "agg.parquet"
    res = invoke_servecal("traces", "import", "prometheus", src, "-o", out)
    assert res.exit_code == 1, res.output
    text = flat(res.output)
    assert "Traceback" not in res.output and "bad.txt" in text
    import re
    assert re.search(match, text), text
    assert not out.exists()


def test_unknown_metrics_are_listed_not_read(tmp_path):
    src = tmp_path / "extra.txt"
    src.write_text(SCRAPES.read_text().replace("# HELP vllm:num_requests_waiting",
                                               "vllm:spec_decode_num_drafts_total 3\npython_gc_objects 1\n"
                                               "# HELP vllm:num_requests_waiting"))
    _, meta = import_prometheus([src], window_s=300)
    assert meta["metrics_not_read"] == "vllm:spec_decode_num_drafts_total"


def test_a_window_where_nothing_finished_is_left_out_with_a_warning(tmp_path):
    # the tests' five scrapes, then two more at +90 s and +120 s that repeat the last one: nothing finishes there
    text = SCRAPES.read_text()
    last = text[text.rindex("# scrape at"):]
    t_last = int(last.split()[3])
    idle = tmp_path / "idle.txt"
    idle.write_text(text + "".join(last.replace(f"# scrape at {t_last}", f"# scrape at {t_last + d}", 1)
                                   for d in (30, 60)))
    out = tmp_path / "idle.parquet"
    res = invoke_servecal("traces", "import", "prometheus", idle, "--window-s", "30", "-o", out)
    assert res.exit_code == 0, res.output
    assert "2 level(s) (0-30 s, 30-60 s)" in flat(res.output)
    assert "window(s) with no finished request left out: 60-90 s, 90-120 s" in flat(res.output), res.output
