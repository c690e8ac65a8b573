"""Processes: Ctrl-C at any moment (exit 130, no traceback), a Ctrl-C after the output is in place,
stale temporary files of killed runs, numerical warnings kept off the terminal."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

import schemas.tables as tables
from calibrate.umbrella import main as servecal
from schemas.atomic import remove_stale_temp_files
from schemas.tables import REQUEST_TRACE, to_table, write_table

BIN = Path(sys.executable).parent


def script(name):
    p = BIN / name
    if not p.exists():  # the README's install always makes them: a missing one is a broken install, not a skip
        pytest.fail(f"console script {name} not installed beside {sys.executable} (pip install '.[test,ray]')")
    return str(p)


@pytest.fixture
def trace(tmp_path):
    df = pd.DataFrame({"request_id": [str(i) for i in range(400)], "arrival_time_s": [i * 0.01 for i in range(400)],
                       "num_prompt_tokens": 500, "num_output_tokens": 200})
    write_table(to_table(REQUEST_TRACE, df), tmp_path / "t.parquet")
    from schemas.calibration import Calibration, FittedParam
    from schemas.specs import get_gpu, get_model

    params = {k: FittedParam(v) for k, v in (("eta_compute", 0.5), ("eta_mem", 0.8), ("t_step_s", 1e-4))}
    Calibration(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), 1, params).write(tmp_path / "cal.json")
    return tmp_path


# From 0.3 s on the interpreter has started (before that, Python's own start-up handles SIGINT)
@pytest.mark.parametrize("delay_s", [0.3, 0.6, 1.0, 1.6])
def test_ctrl_c_during_start_up_is_exit_130_without_traceback(trace, delay_s):
    p = subprocess.Popen([script("traces"), "validate", str(trace / "t.parquet")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    time.sleep(delay_s)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode in (130, 0), (p.returncode, err)  # 0: it had finished
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err, err.decode()
    if p.returncode == 130:
        assert err.strip().count(b"\n") == 0 and b"Aborted" in err


def _children(pid):
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


def test_ctrl_c_in_sweep_workers(trace):
    out = trace / "sweep.csv"
    p = subprocess.Popen([script("replay"), str(trace / "t.parquet"), "--calibration", str(trace / "cal.json"),
                          "--sweep", "rate-scale=1:400:1", "--sweep", "max-num-seqs=4,8", "--exact-steps",
                          "--jobs", "2", "--sweep-out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None and len(_children(p.pid)) < 2:
        time.sleep(0.05)
    time.sleep(2.5)  # the workers have imported and are replaying
    assert p.poll() is None, p.communicate()
    os.killpg(p.pid, signal.SIGINT)  # as a terminal does: the whole process group
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err.decode()
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err, err.decode()
    assert not out.exists() and not list(trace.glob(".sweep.csv.*"))


def test_ctrl_c_right_after_the_rename_is_not_a_failure(tmp_path, monkeypatch):
    real_replace = os.replace

    def replace_then_interrupt(src, dst):
        real_replace(src, dst)
        os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C just as the output lands

    monkeypatch.setattr(tables.os, "replace", replace_then_interrupt)
    out = tmp_path / "s.parquet"
    res = CliRunner().invoke(servecal, ["traces", "synth", "--requests", "5", "--rate", "1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert out.exists() and "5 requests" in res.output
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_ctrl_c_before_the_rename_leaves_nothing(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(pq, "write_table", interrupted)
    out = tmp_path / "s.parquet"
    res = CliRunner().invoke(servecal, ["traces", "synth", "--requests", "5", "--rate", "1", "-o", str(out)])
    assert res.exit_code != 0 and not out.exists() and not list(tmp_path.iterdir())


def test_stale_temp_files_of_a_killed_run_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    old = time.time() - 3600
    names = {
        "stale": f".out.parquet.{dead.pid}.abcd1234.tmp",          # a killed run's
        "legacy": ".out.parquet.k2j4h5g6.tmp",                      # older versions: no pid
        "other_folder_file": "out.parquet.tmp",                     # not our pattern
        "user": ".notes.txt",                                       # not ours
        "alive": f".other.parquet.{os.getppid()}.zzzz9999.tmp",     # a running process's
    }
    for n in names.values():
        (tmp_path / n).write_bytes(b"x")
        os.utime(tmp_path / n, (old, old))
    (tmp_path / ".new.parquet.1.qqqqqqqq.tmp").write_bytes(b"x")  # newer than this run: left alone
    res = CliRunner().invoke(servecal, ["traces", "synth", "--requests", "5", "--rate", "1",
                                        "-o", str(tmp_path / "out.parquet")])
    assert res.exit_code == 0, res.output
    left = {p.name for p in tmp_path.iterdir()}
    assert names["stale"] not in left and names["legacy"] not in left
    assert {names["other_folder_file"], names["user"], names["alive"], ".new.parquet.1.qqqqqqqq.tmp",
            "out.parquet"} <= left
    assert remove_stale_temp_files(tmp_path / "missing") == []


def test_numerical_warnings_do_not_reach_the_terminal():
    code = ("from schemas.quiet import quiet_warnings; quiet_warnings()\n"
            "import numpy as np, subprocess, sys\n"
            "np.array([0.0]) / 0; np.mean([]); np.log(np.array([-1.0])); np.exp(np.array([1e4]))\n"
            "import warnings; warnings.warn('kept', UserWarning)\n"
            "subprocess.run([sys.executable, '-c', 'import numpy as np; np.array([1.0]) / 0'], check=True)\n")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "RuntimeWarning" not in cp.stderr and "kept" in cp.stderr


def test_an_output_written_after_the_last_declared_one_does_not_leave_ctrl_c_held(tmp_path):
    """vllm-log writes its --timeseries-csv after its -o: Ctrl-C is the default again afterwards."""
    from schemas.atomic import expect_outputs, release_sigint, write_text_atomic

    expect_outputs([tmp_path / "a.txt"])
    write_text_atomic("a", tmp_path / "a.txt")  # the last declared output: Ctrl-C held from here
    write_text_atomic("b", tmp_path / "b.txt")  # one more, not declared
    assert release_sigint() is False
    expect_outputs(None)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
