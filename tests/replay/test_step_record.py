"""The step record declared once, the step-time expression written once (and quoted by
docs/cost-model.md), and the time of each term (eval_components) in the step trace and the report."""
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replay.config import EngineOptions, RecordOptions, ReplayConfig
from replay.cost.cost_model import RooflineCostModel
from replay.cost.cost_terms import DEFAULT_TERMS, TERMS
from replay.report.step_terms import term_time_cells
from replay.core.result_columns import steps_frame
from replay.simulate import replay_frame
from replay.cost.step_time import FORMULA
from schemas.cost_params import CostParams
from schemas.specs import GpuSpec, Link, ModelSpec, get_model
from schemas.step_record import DERIVED_FEATURES, FEATURE_NAMES, KEPT_NAMES, STEP_RECORD, StepRow, feature_arrays
from schemas.errors import ValidationError
from schemas.step_record import derived_columns
from schemas.tables import STEP_COLUMNS, STEP_TRACE, to_table
from schemas.validate import validate

GPU = GpuSpec(name="g", peak_flops=1e15, mem_bandwidth_bytes_per_s=2e12, mem_bytes=80 * 2**30)
LLAMA = ModelSpec(name="8b", num_params=8e9, num_active_params=8e9, num_layers=32, hidden_size=4096,
                  num_attention_heads=32, num_kv_heads=8, head_dim=128, dtype_bytes=2, max_model_len=8192)
COST_MODEL_PAGE = Path(__file__).resolve().parents[2] / "docs" / "cost-model.md"


def test_step_trace_columns_are_the_record():
    derived = [f.name for f in DERIVED_FEATURES]
    assert list(STEP_COLUMNS) == [f.name for f in STEP_RECORD] == [*StepRow._fields, *derived]
    assert STEP_COLUMNS["step_duration_s"][0].equals(STEP_COLUMNS["step_start_time_s"][0])  # float64 seconds
    assert str(STEP_COLUMNS["num_decode_tokens"][0]) == "int64" and not STEP_COLUMNS["num_decode_tokens"][1]
    assert KEPT_NAMES == ("num_prefill_tokens", "num_prefill_seqs", "num_decode_seqs", "decode_context_tokens",
                          "prefill_context_tokens", "num_decode_tokens") == FEATURE_NAMES[:6]


def test_absent_optional_features_take_their_defaults():
    x = feature_arrays({"num_prefill_tokens": [0, 64], "num_prefill_seqs": [0, 2], "num_decode_seqs": [3, 0],
                        "decode_context_tokens": [300, 0], "prefill_context_tokens": [np.nan, 10]})
    assert x["prefill_context_tokens"].tolist() == [0, 10]  # a null is absent: 0
    assert x["num_decode_tokens"].tolist() == [3, 0]  # one position per decode
    assert x["num_prefill_seqs"].dtype == np.int64
    no_seqs = feature_arrays({"num_prefill_tokens": [0, 64], "num_decode_seqs": [3, 0],
                              "decode_context_tokens": [1, 0]})
    assert no_seqs["num_prefill_seqs"].tolist() == [0, 1]  # one chunk per step with prefill tokens


def _evaluate_formula(coef, c_x=0.0, m_x=0.0, serial_x=0.0, **features) -> float:
    """FORMULA as written (the one docs/cost-model.md quotes), on the coefficients' values (names without ``_s``);
    ``c_x``, ``m_x``, ``serial_x`` the derived features' time by part."""
    names = {f.removesuffix("_s"): v for f, v in vars(coef).items() if f != "per_feature"}
    scope = {**names, **features, "c_x": c_x, "m_x": m_x, "serial_x": serial_x}
    exec(FORMULA, {}, scope)
    return scope["step"]


@pytest.mark.parametrize("features", [dict(P=512, S=2, D=30, C_d=40_000, C_p=3000, Q=30),
                                      dict(P=0, S=0, D=8, C_d=9000, C_p=0, Q=29),
                                      dict(P=2048, S=1, D=1, C_d=100, C_p=0, Q=1)])
def test_the_written_formula_is_the_code(features):
    """Every coefficient non-zero: Qwen3-30B-A3B, TP 2 x DP 2 with expert parallelism (all-reduce,
    all-to-all, experts touched), overlap 0.3, per-step and per-sequence CPU time, and a quarter
    of its layers made windowed and a quarter linear-attention (a sequence's state read per step)."""
    hybrid = replace(get_model("qwen3-30b-a3b"), num_window_layers=12, sliding_window_tokens=128,
                     num_linear_layers=12, linear_state_bytes=1.1e6, linear_flops_per_token=3.2e6)
    cm = RooflineCostModel(hybrid, GPU, CostParams(t_step_s=3e-4, t_seq_s=2e-5, overlap=0.3,
                                                                       n_half_tokens=50), tp=2, dp=2,
                           expert_parallel=True, tp_link=Link("l", 100e9, 5e-6))
    assert all(cm.coefficients.as_tuple())
    f = features
    code = cm.step_time_s(f["P"], f["D"], f["C_d"], f["C_p"], f["S"], num_decode_tokens=f["Q"])
    assert code == pytest.approx(_evaluate_formula(cm.coefficients, **features), rel=1e-12)


def test_the_cost_model_page_quotes_the_formula_and_names_every_term():
    text = COST_MODEL_PAGE.read_text()
    assert FORMULA in text
    section = text[text.index(FORMULA):text.index("Peak and bandwidth are the replica's GPUs'")]
    listed = re.findall(r"^(\w+)\s{2,}", section, flags=re.M)
    assert listed == list(TERMS)


def test_eval_components_hand_computed():
    """Llama 8B, 300 prefill tokens: overhead 1 ms; GEMMs 2 x 8e9 x 300 / 0.5e15 = 9.6 ms; weights
    16e9 B / 2e12 B/s = 8 ms; overlap 0.25 hides (1 - 0.25) x 8 = 6 ms: 12.6 ms in all."""
    cm = RooflineCostModel(LLAMA, GPU, CostParams(eta_compute=0.5, eta_mem=1.0, t_step_s=1e-3, overlap=0.25),
                           terms=("step_overhead", "dense_compute", "weight_memory", "overlap"))
    parts = cm.eval_components(np.array([300, 0]), np.array([0, 0]), np.array([0, 0]))
    assert list(parts) == ["step_overhead", "dense_compute", "weight_memory", "overlap"]
    assert [v[0] for v in parts.values()] == pytest.approx([1e-3, 9.6e-3, 8e-3, -6e-3], rel=1e-12)
    assert [v[1] for v in parts.values()] == [0.0] * 4  # no tokens: no time
    assert sum(parts.values())[0] == pytest.approx(cm.step_time_s(300, 0, 0), rel=1e-12) == 12.6e-3


@pytest.mark.parametrize("terms", [("step_overhead", "dense_compute", "kv_memory"), tuple(TERMS)])
def test_components_sum_to_the_step_time(terms):
    """Without the overlap term the seed's max hides all of the smaller of compute and memory."""
    cm = RooflineCostModel(get_model("qwen3-30b-a3b"), GPU, CostParams(t_seq_s=1e-5, overlap=0.4), tp=2, dp=2,
                           expert_parallel=True, terms=terms)
    rng = np.random.default_rng(0)
    p, d = rng.integers(0, 4096, 50), rng.integers(0, 256, 50)
    cd, cp = d * rng.integers(1, 4000, 50), np.where(p > 0, rng.integers(0, 8000, 50), 0)
    s, q = np.where(p > 0, rng.integers(1, 4, 50), 0), d + np.where(d > 0, rng.integers(0, 3, 50), 0) * d
    parts = cm.eval_components(p, d, cd, cp, s, num_decode_tokens=q)
    assert set(parts) == set(terms) | {"overlap"} and (parts["overlap"] <= 0).all()
    np.testing.assert_allclose(sum(parts.values()), cm.step_time_s(p, d, cd, cp, s, num_decode_tokens=q), rtol=1e-12)


def test_the_simulated_step_trace_has_each_terms_time():
    trace = pd.DataFrame({"request_id": ["a", "b"], "arrival_time_s": [0.0, 0.01], "num_prompt_tokens": [3000, 200],
                          "num_output_tokens": [4, 40]})
    cm = RooflineCostModel(LLAMA, GPU, CostParams(t_step_s=2e-4))
    cfg = ReplayConfig(EngineOptions(max_num_batched_tokens=2048), record=RecordOptions(steps=True))
    _, engine = replay_frame(trace, cm, cfg)
    steps = steps_frame(engine)
    assert list(steps.columns) == [n for n in STEP_COLUMNS if n != "num_decode_tokens"] + [
        f"t_{t}_s" for t in DEFAULT_TERMS if t != "overlap"] + ["t_overlap_s"]
    terms = steps.filter(regex=r"^t_\w+_s$").sum(axis=1)
    np.testing.assert_allclose(terms, steps["step_duration_s"], rtol=1e-12)
    assert steps["num_prefill_tokens"].iloc[0] == 2048 and steps["t_overlap_s"].iloc[0] < 0


def test_where_the_time_goes_table():
    steps = pd.DataFrame({"step_duration_s": [0.010, 0.030], "t_step_overhead_s": [0.001, 0.001],
                          "t_dense_compute_s": [0.006, 0.020], "t_weight_memory_s": [0.008, 0.008],
                          "t_overlap_s": [-0.006, -0.006], "t_x": [1.0, 1.0]})
    head, rows = term_time_cells(steps.assign(step_duration_s=[0.009, 0.023]))
    assert head == ["term", "seconds", "share", "ms_per_step"]
    assert rows == [["step_overhead", "0.002", "6.2 %", "1"], ["dense_compute", "0.026", "81.2 %", "13"],
                    ["weight_memory", "0.016", "50.0 %", "8"], ["overlap", "-0.012", "-37.5 %", "-6"],
                    ["all steps", "0.032", "100.0 %", "16"]]
    # 8 ms more than the terms (a swap preemption's KV copy): an "other" row
    _, rows = term_time_cells(steps)
    assert rows[-2] == ["other", "0.008", "20.0 %", "4"]
    assert term_time_cells(steps[["step_duration_s"]]) is None


def test_replay_steps_out_and_report_show_where_the_time_goes(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from replay.cli import main
    from test_compare import make_cli_inputs
    from traces.io import read_trace

    trace, cal, opts = make_cli_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, [str(trace), "--calibration", str(cal), *opts, "--steps-out", "s.parquet",
                                    "--report", "r.md", "--no-band"])
    assert res.exit_code == 0, res.output
    _, steps, _ = read_trace("s.parquet")
    terms = [c for c in steps.columns if re.fullmatch(r"t_\w+_s", c)]
    assert terms and terms[-1] == "t_overlap_s"
    np.testing.assert_allclose(steps[terms].sum(axis=1), steps["step_duration_s"], rtol=1e-9)
    report = (tmp_path / "r.md").read_text()
    assert "## Where the time goes" in report and "| all steps |" in report


def test_a_derived_column_must_be_its_derivation():
    """A step trace may omit a derived feature; a value its kept features do not give is refused,
    naming the column, the row and the derived value."""
    kept = {"num_prefill_tokens": [390, 0, 0], "num_prefill_seqs": [1, 0, 0], "num_decode_seqs": [0, 9, 300],
            "decode_context_tokens": [0, 900, 30_000]}
    frame = pd.DataFrame({"replica_id": 0, "step_start_time_s": [0.0, 0.1, 0.2], "step_duration_s": 0.01, **kept})
    name = DERIVED_FEATURES[0].name
    derived = derived_columns(feature_arrays(kept))[name]
    validate(to_table(STEP_TRACE, frame), "ok.parquet")
    validate(to_table(STEP_TRACE, frame.assign(**{name: derived})), "ok.parquet")
    with pytest.raises(ValidationError, match=rf"'{name}', row\(s\) 1: differs from its value derived .* "
                                              rf"\(row 1: {derived[1]}\)"):
        validate(to_table(STEP_TRACE, frame.assign(**{name: derived + [0, 1, 0]})), "off.parquet")


def test_the_step_table_is_one_order_on_both_paths_with_several_replicas():
    """Three replicas behind round robin: the step-by-step path and the fast path (implicit
    decoders, closed-form decode runs) record the same steps; the table lists them by replica,
    then start time, on both, so it is the same table row for row (issue #33)."""
    from traces.synth import synth_requests

    trace = synth_requests(240, 30.0, "uniform:50,900", "uniform:20,300", seed=5)
    cm = RooflineCostModel(get_model("llama-3.1-8b"), GpuSpec("g", 1e15, 2e12, 80 * 2**30),
                           CostParams(eta_mem=0.8, t_step_s=3e-4, t_seq_s=2e-5))
    tables = []
    for exact in (True, False):
        cfg = ReplayConfig.from_options(RecordOptions(steps=True), exact_steps=exact, replicas=3)
        _, engine = replay_frame(trace, cm, cfg)
        tables.append(steps_frame(engine))
    slow, fast = tables
    assert len(set(slow["replica_id"])) == 3
    keys = list(zip(slow["replica_id"], slow["step_start_time_s"]))
    assert keys == sorted(keys)
    pd.testing.assert_frame_equal(slow, fast, check_exact=False, rtol=1e-9, atol=1e-12)
