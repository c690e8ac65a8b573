"""ReplayConfig: each part checks its values, the whole checks the rules between parts, options by name."""
import pickle

import pytest

from replay.config import (ClosedLoopOptions, DisaggOptions, EngineOptions, RecordOptions, ReplayConfig,
                           SchedulingOptions)
from replay.errors import ConfigError, OptionError


@pytest.mark.parametrize("make, needle", [
    (lambda: EngineOptions(max_num_seqs=0), "--max-num-seqs must be >= 1, not 0"),
    (lambda: EngineOptions(num_gpu_blocks=0), "--num-gpu-blocks must be >= 1"),
    (lambda: EngineOptions(gpu_memory_utilization=1.5), r"--gpu-memory-utilization must be in \(0, 1\]"),
    (lambda: EngineOptions(preemption_mode="drop"), "--preemption-mode drop: unknown"),
    (lambda: EngineOptions(swap_link="carrier-pigeon"), "--swap-link carrier-pigeon: unknown"),
    (lambda: SchedulingOptions(router="random"), "--router random: unknown"),
    (lambda: SchedulingOptions(slo_ttft_s=0.0), "--slo-ttft-s must be > 0"),
    (lambda: DisaggOptions(tp_decode=0), "--tp-decode must be >= 1"),
    (lambda: DisaggOptions(first_token_from="both"), "--first-token-from both: unknown"),
    (lambda: ClosedLoopOptions(think_time_s=1.0), "give --concurrency too"),
])
def test_each_part_checks_its_values(make, needle):
    with pytest.raises(ConfigError, match=needle):
        make()


def test_rules_between_parts():
    with pytest.raises(ConfigError, match="--decode-replicas, --link: only --scheduler disagg uses these"):
        ReplayConfig(disagg=DisaggOptions(decode_replicas=2, link="pcie5"))
    with pytest.raises(ConfigError, match="--replicas: with --scheduler disagg"):
        ReplayConfig(scheduling=SchedulingOptions("disagg", replicas=2))
    assert ReplayConfig(scheduling=SchedulingOptions("disagg")).disagg == DisaggOptions()


def test_options_by_name_round_trip():
    cfg = ReplayConfig.from_options(RecordOptions(steps=True), scheduler="sjf", max_num_seqs=8, concurrency=4)
    assert (cfg.engine.max_num_seqs, cfg.scheduling.scheduler, cfg.closed_loop.concurrency) == (8, "sjf", 4)
    assert cfg.disagg is None and cfg.record.steps
    assert ReplayConfig.from_options(cfg.record, **cfg.options()) == cfg
    assert cfg.with_options(max_num_seqs=16).engine.max_num_seqs == 16
    with pytest.raises(ConfigError, match="--max-num-seq: not an option"):
        ReplayConfig.from_options(max_num_seq=8)


def test_with_scheduler_moves_between_colocated_and_disagg():
    base = ReplayConfig(scheduling=SchedulingOptions(replicas=2))
    pools = DisaggOptions(decode_replicas=3)
    d = base.with_scheduler("disagg", pools)
    assert d.scheduling.replicas == 1 and d.disagg == pools
    back = d.with_scheduler("fcfs")
    assert back.disagg is None and back.scheduling.scheduler == "fcfs"


def test_option_error_names_option_value_and_expectation_and_pickles():
    err = OptionError("--concurrency", 0, "an integer >= 1")
    assert str(err) == "--concurrency must be an integer >= 1, not 0"
    again = pickle.loads(pickle.dumps(err))
    assert (again.option, again.value, again.expected) == ("--concurrency", 0, "an integer >= 1")
