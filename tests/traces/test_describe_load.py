"""``traces describe --calibration``: the M/G/1 view of a trace (seed section 3)."""
import re

import numpy as np
import pytest
from click.testing import CliRunner

from calibrate.umbrella import traces_cli
from replay.cost.cost_model import RooflineCostModel
from replay.cost.cost_terms import SEED_TERMS
from schemas.cost_params import CostParams
from replay.analysis.queueing import offered_load, request_service_times_s
from helpers import write_calibration
from schemas.specs import get_gpu, get_model
from schemas.tables import REQUEST_TRACE, to_table, write_table
from traces.synth import synth_requests

PARAMS = CostParams(eta_compute=0.5, eta_mem=0.8, t_step_s=1e-4)


def test_service_time_of_one_request_alone():
    cm = RooflineCostModel(get_model("qwen2.5-1.5b"), get_gpu("a100-80gb"), PARAMS, terms=SEED_TERMS)
    s = request_service_times_s([100], [3], cm)
    # prefill of 100 tokens, then decode steps at sequence lengths 102 and 103
    expected = cm.prefill_time_s(100) + cm.decode_time_s(1, 102) + cm.decode_time_s(1, 103)
    assert s[0] == pytest.approx(expected, rel=1e-12)


def test_describe_with_calibration_prints_rho_and_pk(tmp_path):
    df = synth_requests(400, 2.0, "fixed:256", "fixed:32", seed=3)
    write_table(to_table(REQUEST_TRACE, df), tmp_path / "t.parquet")
    write_calibration(RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), PARAMS, terms=SEED_TERMS),
                      tmp_path / "cal.json")
    res = CliRunner().invoke(traces_cli, ["describe", str(tmp_path / "t.parquet"),
                                          "--calibration", str(tmp_path / "cal.json")])
    assert res.exit_code == 0, res.output
    cm = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), PARAMS, terms=SEED_TERMS)
    load = offered_load(df["arrival_time_s"], df["num_prompt_tokens"], df["num_output_tokens"], cm)
    assert 0 < load["rho"] < 1
    assert f"rho = {load['rho']:.3f}" in res.output
    assert f"P-K mean wait (M/G/1) = {load['pk_mean_wait_s'] * 1e3:.1f} ms" in res.output
    replayed = float(re.search(r"replay mean wait = ([0-9.]+) ms", res.output).group(1))
    # deterministic service (SCV ~ 0): the replayed wait of 400 Poisson arrivals is near P-K
    assert replayed == pytest.approx(load["pk_mean_wait_s"] * 1e3, rel=0.5)
    assert np.isfinite(load["second_moment_s2"])


def test_the_load_view_is_composed_not_patched_in():
    """``servecal traces describe`` has the replay's ``--calibration``; the traces package's own
    ``describe`` (``traces.cli.main``) is left as that package made it, after the top-level
    command line was imported."""
    import calibrate.umbrella as umbrella
    from traces.cli import main as traces_main

    def options(cmd):
        return {p.name for p in cmd.params}

    own, composed = traces_main.commands["describe"], umbrella.traces_cli.commands["describe"]
    assert options(composed) == options(own) | {"calibration_path", "model"}
    assert "calibration_path" not in options(own) and "--calibration" not in own.help
    assert umbrella.main.commands["traces"] is umbrella.traces_cli
    assert set(umbrella.traces_cli.commands) == set(traces_main.commands)
