"""Ray for real (``pip install '.[ray]'``): a local Ray cluster runs a sweep's points and a
request fit's starts, and gives exactly the local results. Skipped when Ray is not installed;
marked slow (starting Ray takes a few seconds)."""
import pandas as pd
import pytest
from click.testing import CliRunner

from replay.config import ReplayConfig, SchedulingOptions
from replay.sweep import SweepContext, parse_sweeps, run_sweep

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install '.[ray]')")

from test_sweep import COST, TRACE, _fit, _measured_request_log, _same_fit  # noqa: E402

pytestmark = pytest.mark.slow

SWEEP = ["rate-scale=0.5,1,2", "scheduler=fcfs,chunked"]


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray of 2 CPUs for the module's tests (map_on_ray then uses it, and leaves it running)."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def test_sweep_on_ray_equals_local(local_ray):
    ctx = SweepContext(TRACE, {}, COST, ReplayConfig(scheduling=SchedulingOptions(slo_ttft_s=0.3)))
    sweeps = parse_sweeps(SWEEP)
    on_ray = run_sweep(ctx, sweeps, ray_address="auto")
    assert local_ray.is_initialized()  # a Ray it did not start stays up
    pd.testing.assert_frame_equal(on_ray, run_sweep(ctx, sweeps, jobs=1), check_exact=True)


def test_cli_sweep_on_ray_prints_the_local_table(local_ray, tmp_path):
    from replay.cli import main
    from test_sweep import _cli_files

    trace, cal = _cli_files(tmp_path)
    args = [str(trace), "--calibration", str(cal), "--slo-ttft-s", "0.3", *sum((["--sweep", s] for s in SWEEP), [])]
    on_ray = CliRunner().invoke(main, args + ["--ray-address", "auto", "--sweep-out", str(tmp_path / "ray.csv")])
    local = CliRunner().invoke(main, args + ["--jobs", "1", "--sweep-out", str(tmp_path / "local.csv")])
    assert on_ray.exit_code == 0 and local.exit_code == 0, on_ray.output + local.output
    assert "on Ray (auto)" in on_ray.output

    def table(out):
        return [line for line in out.splitlines() if line[:1] == " " or line.startswith("rate_scale")]

    assert table(on_ray.output) == table(local.output)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "ray.csv"), pd.read_csv(tmp_path / "local.csv"),
                                  check_exact=True)


def test_request_fit_on_ray_equals_local(local_ray):
    trace, cfg = _measured_request_log()
    _same_fit(_fit(trace, cfg, jobs=1), _fit(trace, cfg, ray_address="auto"))


def test_sweep_starts_and_stops_its_own_local_ray():
    """With no Ray running, ``--ray-address local`` starts one (all CPUs) and shuts it down."""
    if ray.is_initialized():
        ray.shutdown()
    ctx = SweepContext(TRACE, {}, COST, ReplayConfig())
    sweeps = parse_sweeps(["rate-scale=1,2"])
    on_ray = run_sweep(ctx, sweeps, ray_address="local")
    assert not ray.is_initialized()
    pd.testing.assert_frame_equal(on_ray, run_sweep(ctx, sweeps, jobs=1), check_exact=True)
