"""Faults the long fuzz run found in the vllm-otlp and vllm-log importers: one message that
names the file (and line or field), exit 1, no traceback, no output."""
import json

import pytest
from click.testing import CliRunner

from calibrate.umbrella import main as servecal

SPANS = "vllm_otlp_spans_codellama34b_prefill_sweep.jsonl"
LOG = "blis_eval_codellama34b_prefill_sweep_vllm.log"


def _fails_cleanly(args, path, tmp_path):
    res = CliRunner().invoke(servecal, [str(a) for a in args])
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert str(path) in res.output and "Traceback" not in res.output
    assert not (tmp_path / "out.parquet").exists()
    return res.output


def _otlp(tmp_path, real_data_dir, change):
    first = json.loads((real_data_dir / SPANS).read_text().splitlines()[0])
    change(first)
    p = tmp_path / "o.jsonl"
    p.write_text(json.dumps(first) + "\n")
    return _fails_cleanly(["traces", "import", "vllm-otlp", p, "-o", tmp_path / "out.parquet"], p, tmp_path)


def _span(d):
    return d["resourceSpans"][0]["scopeSpans"][0]["spans"][0]


@pytest.mark.parametrize("change,needle", [
    (lambda d: d.update(resourceSpans=7), "resourceSpans"),
    (lambda d: _span(d).update(attributes=5.0), "attributes is not a list"),
    (lambda d: _span(d)["attributes"][3]["value"].update(intValue=str(2 ** 70)), "64-bit integer"),
    (lambda d: _span(d)["attributes"][0]["value"].update(doubleValue=10 ** 400), "64-bit float"),
])
def test_otlp_of_the_wrong_shape_or_range(tmp_path, real_data_dir, change, needle):
    assert needle in _otlp(tmp_path, real_data_dir, change)


def test_otlp_line_that_is_not_an_object(tmp_path):
    p = tmp_path / "o.jsonl"
    p.write_text("[1, 2]\n")
    _fails_cleanly(["traces", "import", "vllm-otlp", p, "-o", tmp_path / "out.parquet"], p, tmp_path)


@pytest.mark.parametrize("old,new", [("06:11:13", "06:11:61"), ("Running: 1 reqs", "Running: 1" + "0" * 30 + " reqs")])
def test_vllm_log_impossible_time_or_count(tmp_path, real_data_dir, old, new):
    text = (real_data_dir / LOG).read_text()
    assert old in text
    p = tmp_path / "v.log"
    p.write_text(text.replace(old, new, 1))
    out = _fails_cleanly(["traces", "import", "vllm-log", p, "-o", tmp_path / "out.parquet"], p, tmp_path)
    assert "line" in out


def test_vllm_log_implausible_engine_index(tmp_path, real_data_dir):
    text = (real_data_dir / LOG).read_text()
    p = tmp_path / "v.log"
    p.write_text(text.replace("Engine 000: Avg prompt", "Engine " + "9" * 30 + ": Avg prompt", 1))
    assert "engine index" in _fails_cleanly(["traces", "import", "vllm-log", p, "-o", tmp_path / "out.parquet"], p,
                                            tmp_path)


def test_calibration_with_a_huge_model_field_names_the_file(tmp_path):
    from schemas.calibration import Calibration, FittedParam
    from schemas.errors import SchemaError
    from schemas.specs import get_gpu, get_model

    Calibration(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), 1, {"eta_mem": FittedParam(0.8)}).write(
        tmp_path / "c.json")
    d = json.loads((tmp_path / "c.json").read_text())
    d["model"]["hidden_size"] = 10 ** 400
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(SchemaError, match="bad.json"):
        Calibration.read(tmp_path / "bad.json")
