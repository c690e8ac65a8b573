"""KV capacity read from a request log (replay/analysis/kv_capacity_log.py, issue #21 item 6): a
synthetic log of a known cache (the engine's own replay at 500 blocks) is read back."""
import numpy as np
import pandas as pd
import pytest

from replay.config import ReplayConfig
from replay.cost.cost_model import RooflineCostModel
from replay.analysis.kv_capacity_log import blocks_in_use, kv_capacity_from_log
from replay.simulate import replay_frame
from schemas.specs import get_gpu, get_model

CAPACITY_BLOCKS = 500


def synthetic_log(rate_per_s: float, n: int = 400, seed: int = 0) -> pd.DataFrame:
    """A measured request log of Llama-3.1-8B on one H100 with a 500-block KV cache (16 tokens):
    Poisson arrivals at ``rate_per_s``, prompts 200-800 tokens, outputs 50-300; vLLM v0's
    prefill-first scheduler (``fcfs``); the replay's predictions are the log's measurements."""
    rng = np.random.default_rng(seed)
    trace = pd.DataFrame({
        "request_id": [f"r{i}" for i in range(n)],
        "arrival_time_s": np.cumsum(rng.exponential(1 / rate_per_s, n)),
        "num_prompt_tokens": rng.integers(200, 800, n),
        "num_output_tokens": rng.integers(50, 300, n),
    })
    cost = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb"))
    cfg = ReplayConfig.from_options(scheduler="fcfs", max_num_seqs=256, max_num_batched_tokens=2048,
                                    num_gpu_blocks=CAPACITY_BLOCKS)
    res, _ = replay_frame(trace, cost, cfg)
    return trace.assign(ttft_s=res["pred_ttft_s"], e2e_s=res["pred_e2e_s"])


@pytest.mark.parametrize("rate_per_s", [30.0, 60.0])
def test_a_saturated_log_gives_its_capacity_within_6_percent(rate_per_s):
    # the log counts requests preempted by recompute as running: a few % over (module Notes)
    log = synthetic_log(rate_per_s)
    est = kv_capacity_from_log(log, block_size=16, max_num_seqs=256)
    assert est.num_gpu_blocks is not None, est.describe()
    assert 0.95 * CAPACITY_BLOCKS <= est.num_gpu_blocks <= 1.06 * CAPACITY_BLOCKS
    assert "from the log" in est.describe()


def test_a_log_that_never_fills_the_cache_gives_only_a_lower_bound():
    log = synthetic_log(rate_per_s=1.0, n=100)
    est = kv_capacity_from_log(log, block_size=16, max_num_seqs=256)
    assert est.num_gpu_blocks is None
    assert 0 < est.lower_bound_blocks <= CAPACITY_BLOCKS
    assert est.describe().startswith(f">= {est.lower_bound_blocks:,} blocks")


def test_blocks_in_use_by_hand():
    # one request: arrives at 0, first token at 1 s, ends at 3 s; 20 prompt + 5 output tokens.
    # At 2 s (halfway) it has generated 1 + 2 tokens: ceil(23 / 16) = 2 blocks; at 0.5 s it waits.
    log = pd.DataFrame({"arrival_time_s": [0.0], "ttft_s": [1.0], "e2e_s": [3.0],
                        "num_prompt_tokens": [20], "num_output_tokens": [5]})
    blocks, running, waiting = blocks_in_use(log, np.array([0.5, 2.0, 3.5]), 16)
    assert blocks.tolist() == [0.0, 2.0, 0.0]
    assert running.tolist() == [0.0, 1.0, 0.0] and waiting.tolist() == [1.0, 0.0, 0.0]


def test_a_log_without_latencies_is_refused_in_one_sentence():
    log = pd.DataFrame({"arrival_time_s": [0.0], "num_prompt_tokens": [20], "num_output_tokens": [5]})
    with pytest.raises(ValueError, match="ttft_s, e2e_s"):
        kv_capacity_from_log(log)


def test_replay_reads_the_blocks_from_a_saturated_log_and_says_so(tmp_path):
    """``replay`` of a run that does not record num_gpu_blocks: the plateau's blocks, said in one
    line; ``--num-gpu-blocks`` overrides."""
    from click.testing import CliRunner

    from helpers import write_calibration
    from replay.cli import main as replay_cli
    from traces.io import write_trace

    log = synthetic_log(rate_per_s=60.0)
    path = tmp_path / "log.parquet"
    write_trace(log, "request_trace/1", path)
    cal = tmp_path / "cal.json"
    write_calibration(RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-80gb")), cal)
    args = [str(path), "--calibration", str(cal), "--no-band", "--scheduler", "fcfs"]
    res = CliRunner().invoke(replay_cli, args)
    assert res.exit_code == 0, res.output
    blocks = kv_capacity_from_log(log, 16, 256).num_gpu_blocks
    assert f"num_gpu_blocks not recorded: {blocks:,} read from the log" in res.output
    assert f"KV cache {blocks} blocks" in res.output
    res = CliRunner().invoke(replay_cli, [*args, "--num-gpu-blocks", "500"])
    assert res.exit_code == 0 and "not recorded" not in res.output and "KV cache 500 blocks" in res.output


def test_calibrate_fit_reads_the_blocks_and_records_them_for_replay(tmp_path):
    """``calibrate fit`` on a saturated log that does not record num_gpu_blocks fits under the
    plateau's blocks, says so, and writes them in the calibration's engine settings."""
    from click.testing import CliRunner

    from calibrate.cli import main as calibrate_cli
    from schemas.calibration import Calibration
    from traces.io import write_trace

    log = synthetic_log(rate_per_s=60.0)
    path = tmp_path / "log.parquet"
    write_trace(log, "request_trace/1", path)
    out = tmp_path / "cal.json"
    res = CliRunner().invoke(calibrate_cli, ["fit", str(path), "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                                             "--scheduler", "fcfs", "--free", "eta_mem", "--variants", "blend",
                                             "-o", str(out)])
    assert res.exit_code == 0, res.output
    blocks = kv_capacity_from_log(log, 16, 256).num_gpu_blocks
    assert f"num_gpu_blocks not recorded: {blocks:,} read from the log" in res.output
    assert Calibration.read(out).engine["num_gpu_blocks"] == blocks
