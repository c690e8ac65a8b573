"""The engine settings, declared once (schemas/engine_settings.py): every command spells them
the same way, vLLM's flags among the spellings; the configuration's defaults, choices and the
trace metadata's keys are the table's; older names are still read."""
from __future__ import annotations

import json
from dataclasses import MISSING, fields

import click
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from calibrate.cli import main as calibrate
from replay.cli import main as replay
from replay.cli.plan import plan
from replay.config import ClosedLoopOptions, DisaggOptions, EngineOptions, ReplayConfig, SchedulingOptions
from replay.errors import ConfigError
from schemas.engine_settings import ALIASES, PARTS, SETTINGS, canonical, of_part, problem

#: Every command that takes engine settings.
COMMANDS = {"replay": replay, "calibrate fit": calibrate.commands["fit"],
            "calibrate validate": calibrate.commands["validate"], "servecal plan": plan}
#: The settings every command of a replay or a fit takes: all with a flag but ``seed``
#: (``calibrate fit --seed`` seeds its bootstrap; ``replay --seed`` the simulation).
SHARED = {s.name for s in SETTINGS.values() if s.flags} - {"seed"}
#: The settings ``servecal plan`` varies or sets.
PLAN = {"tp", "pp", "dp", "replicas", "max_num_seqs", "max_num_batched_tokens", "scheduler", "prefill_replicas",
        "decode_replicas", "tp_prefill", "tp_decode", "router", "gpu_memory_utilization"}


def spellings(spec) -> set[str]:
    """What a command accepts for a declared setting: its flags, and ``--no-X`` for a flag ``--X``."""
    return set(spec.flags) | ({f"--no-{f[2:]}" for f in spec.flags} if spec.type is bool else set())


def setting_params(command) -> dict[str, set[str]]:
    return {p.name: set(p.opts) | set(p.secondary_opts) for p in command.params
            if isinstance(p, click.Option) and p.name in SETTINGS}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_spells_each_setting_as_declared(name):
    params = setting_params(COMMANDS[name])
    assert set(params) >= (PLAN if name == "servecal plan" else SHARED)
    for setting, opts in params.items():
        assert opts == spellings(SETTINGS[setting]), (name, setting)
    owner = {f: s.name for s in SETTINGS.values() for f in spellings(s)}
    for p in COMMANDS[name].params:  # no other option takes a declared spelling
        for opt in getattr(p, "opts", []) + getattr(p, "secondary_opts", []):
            assert owner.get(opt, p.name) == p.name, (name, opt, p.name)


def test_the_commands_of_a_replay_or_a_fit_take_the_same_settings():
    exposed = {name: set(setting_params(c)) - {"seed"} for name, c in COMMANDS.items() if name != "servecal plan"}
    assert all(names == SHARED for names in exposed.values()), exposed


def test_vllm_flags_are_among_the_spellings_and_the_names_are_unique():
    for s in SETTINGS.values():
        assert s.part in PARTS
        assert s.vllm_flag is None or s.vllm_flag in s.flags, s.name
    flags = [f for s in SETTINGS.values() for f in s.flags]
    assert len(flags) == len(set(flags))
    assert {"--tensor-parallel-size", "--data-parallel-size", "--pipeline-parallel-size", "--enable-expert-parallel",
            "--num-gpu-blocks-override", "--num-speculative-tokens"} <= set(flags)
    assert not set(ALIASES) & set(SETTINGS)


def test_vllm_spellings_parse_to_the_same_values():
    vllm = ["t.parquet", "--tensor-parallel-size", "2", "--data-parallel-size", "2", "--pipeline-parallel-size", "2",
            "--enable-expert-parallel", "--num-gpu-blocks-override", "100", "--num-speculative-tokens", "3"]
    ours = ["t.parquet", "--tp", "2", "--data-parallel-size", "2", "--pp", "2", "--enable-expert-parallel",
            "--num-gpu-blocks", "100", "--speculative-tokens", "3"]
    a, b = (replay.make_context("replay", list(args)).params for args in (vllm, ours))
    assert a == b
    assert (a["tp"], a["dp"], a["pp"], a["expert_parallel"], a["num_gpu_blocks"], a["num_speculative_tokens"]) == \
        (2, 2, 2, True, 100, 3)
    fit = calibrate.commands["fit"].make_context("fit", ["t.parquet", "-o", "c.json", "--tensor-parallel-size", "4",
                                                        "--no-enable-expert-parallel"]).params
    assert (fit["tp"], fit["expert_parallel"]) == (4, False)
    p = plan.make_context("plan", ["t.parquet", "--tensor-parallel-size", "1,2", "--prefill-tp", "1", "--tp-decode",
                                   "2"]).params
    assert (p["tp"], p["tp_prefill"], p["tp_decode"]) == ("1,2", "1", "2")


def test_the_table_defaults_are_the_configuration_defaults():
    from replay.cost.cost_model import RooflineCostModel
    from schemas.calibration import Calibration

    for part, cls in {"engine": EngineOptions, "scheduling": SchedulingOptions, "disagg": DisaggOptions,
                      "closed_loop": ClosedLoopOptions}.items():
        assert {f.name: f.default for f in fields(cls)} == {s.name: s.default for s in of_part(part)}, part
    for cls in (RooflineCostModel, Calibration):
        declared = {f.name: f.default for f in fields(cls) if f.default is not MISSING}
        assert {s.name: declared[s.name] for s in of_part("hardware") if s.name in declared} == \
            {s.name: s.default for s in of_part("hardware") if s.name in declared}
    assert {"dp", "pp", "expert_parallel"} <= {f.name for f in fields(Calibration) if f.default is not MISSING}
    # replay's and calibrate's options default to the table's (disagg ones: None, "not given")
    for name in ("calibrate fit", "calibrate validate"):
        for p in COMMANDS[name].params:
            if p.name in SHARED and SETTINGS[p.name].part != "disagg":
                assert p.default == SETTINGS[p.name].default, (name, p.name)
    assert {p.name: p.default for p in replay.params if p.name in SETTINGS and SETTINGS[p.name].part == "disagg"} == \
        dict.fromkeys(s.name for s in of_part("disagg"))


def test_the_names_the_engine_accepts_are_the_table_choices():
    from replay.core.routing import ROUTERS
    from replay.schedulers.disagg import FIRST_TOKEN_FROM
    from schemas.specs import link_presets

    assert SETTINGS["router"].known() == tuple(ROUTERS)
    assert SETTINGS["first_token_from"].known() == FIRST_TOKEN_FROM
    assert SETTINGS["link"].known() == SETTINGS["swap_link"].known() == tuple(link_presets())
    assert problem("preemption_mode", "swap") is None and problem("preemption_mode", "evict")[0] == "choice"


@pytest.mark.parametrize("name,value,expected", [
    ("max_num_seqs", 0, ">= 1"), ("gpu_memory_utilization", 0.0, "in (0, 1]"),
    ("spec_acceptance_rate", 1.5, "in [0, 1]"),
    ("long_prefill_token_threshold", -1, ">= 0 (0: no cap)"), ("slo_ttft_s", float("inf"), "> 0 seconds and finite"),
    ("concurrency", 1.5, "an integer >= 1"), ("link_latency_s", float("nan"), ">= 0 seconds and finite"),
    ("max_num_seqs", None, ">= 1"), ("scheduler", None, "a str"), ("link_bandwidth_bytes_per_s", 0.0, "> 0")])
def test_a_value_outside_the_declaration_says_what_is_expected(name, value, expected):
    assert problem(name, value) == ("range", expected)
    assert problem(name, SETTINGS[name].default if SETTINGS[name].default is not None else 1) is None


def test_the_trace_metadata_keys_are_declared():
    from traces.importers.blis_header import ENGINE_KEYS
    from traces.importers.distserve import settings_from_name
    from traces.io import TRACE_SETTINGS

    vllm_names = {s.vllm for s in SETTINGS.values()}
    assert set(TRACE_SETTINGS) == {"max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len",
                                   "num_gpu_blocks", "tensor_parallel_size", "data_parallel_size",
                                   "gpu_memory_utilization", "scheduler", "tp_prefill", "tp_decode", "pp_prefill",
                                   "pp_decode"}
    assert {name for name, _, _ in ENGINE_KEYS.values()} <= vllm_names
    disagg = json.loads(settings_from_name("opt_distserve-c21d11-300-3.exp")["engine_settings"])
    assert disagg == {"scheduler": "disagg", "tp_prefill": 2, "pp_prefill": 1, "tp_decode": 1, "pp_decode": 1}
    assert set(disagg) - {"scheduler"} <= {s.vllm for s in of_part("disagg")}
    assert set(disagg) <= set(TRACE_SETTINGS)


def test_the_older_name_of_the_draft_tokens_is_still_read():
    assert canonical({"speculative_tokens": 3, "max_num_seqs": 8}) == {"num_speculative_tokens": 3, "max_num_seqs": 8}
    assert canonical({"speculative_tokens": 3, "num_speculative_tokens": 2}) == {"num_speculative_tokens": 2}
    cfg = ReplayConfig.from_options(speculative_tokens=3, spec_acceptance_rate=0.5)
    assert cfg.engine.num_speculative_tokens == 3
    assert cfg.with_options(speculative_tokens=2).engine.num_speculative_tokens == 2
    with pytest.raises(ConfigError, match="--speculative-tokens needs --spec-acceptance-rate"):
        ReplayConfig.from_options(speculative_tokens=3)


def _calibration_recording(tmp_path, engine: dict):
    from helpers import write_calibration
    from replay.cost.cost_model import RooflineCostModel
    from schemas.specs import get_gpu, get_model
    from schemas.tables import REQUEST_TRACE
    from traces.io import write_trace

    cal, trace = tmp_path / "cal.json", tmp_path / "t.parquet"
    write_calibration(RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("a100-80gb")), cal)
    d = json.loads(cal.read_text())
    cal.write_text(json.dumps({**d, "engine": engine}))
    rng = np.random.default_rng(0)
    write_trace(pd.DataFrame({"request_id": [f"r{i}" for i in range(20)], "arrival_time_s": np.arange(20) * 0.1,
                              "num_prompt_tokens": rng.integers(10, 500, 20),
                              "num_output_tokens": rng.integers(1, 50, 20)}), REQUEST_TRACE, trace)
    return trace, cal


@pytest.mark.parametrize("key", ["num_speculative_tokens", "speculative_tokens"])
def test_replay_takes_the_speculative_settings_a_calibration_records(tmp_path, key):
    """Both recorded settings are taken, under the current name or the older one (before, K
    was taken without A and the replay refused the calibration)."""
    trace, cal = _calibration_recording(tmp_path, {key: 2, "spec_acceptance_rate": 0.6})
    r = CliRunner().invoke(replay, [str(trace), "--calibration", str(cal), "--no-band"])
    assert r.exit_code == 0, r.output
    assert "speculative decoding: K=2, acceptance 0.6" in r.output
    assert "num_speculative_tokens=2, spec_acceptance_rate=0.6" in " ".join(r.output.split())


def test_a_calibration_records_the_declared_settings_under_the_current_names():
    from calibrate.request_fit import engine_settings

    rec = engine_settings(ReplayConfig(EngineOptions(num_speculative_tokens=3, spec_acceptance_rate=0.7)))
    # a colocated run: the disaggregated pools' degrees are recorded only by a disagg run's calibration
    assert list(rec) == [s.name for s in SETTINGS.values() if s.recorded and s.part not in ("hardware", "disagg")]
    assert (rec["num_speculative_tokens"], rec["spec_acceptance_rate"], rec["scheduler"]) == (3, 0.7, "chunked")
