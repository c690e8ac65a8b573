"""Test helpers shared by several test modules (not fixtures)."""
from __future__ import annotations

from replay.core.engine import Engine
from replay.core.engine_config import EngineConfig
from schemas.calibration import Calibration, FittedParam
from replay.core.request import Request
from replay.schedulers import get_scheduler_factory
from replay.schedulers.base import SchedulerConfig
from schemas.step_record import StepRow


class LinearStepCost:
    """step time = base_s + per_token_s * tokens in the step (the cases' hand-worked cost); the
    decodes' tokens are their positions (``num_decode_tokens``, speculative decoding) when given."""

    def __init__(self, base_s: float, per_token_s: float):
        self.base_s, self.per_token_s = base_s, per_token_s

    def step_time_s(self, num_prefill_tokens, num_decode_seqs, decode_context_tokens, prefill_context_tokens=0,
                    num_prefill_seqs=None, num_decode_tokens=None):
        tokens = num_prefill_tokens + (num_decode_seqs if num_decode_tokens is None else num_decode_tokens)
        return self.base_s + self.per_token_s * tokens if tokens else 0.0


def step_rows(engine) -> list[StepRow]:
    """The engine's recorded steps, each read by name (:class:`schemas.step_record.StepRow`)."""
    return [StepRow._make(s) for s in engine.steps]


def run(reqs, cost, scheduler="chunked", budget=2048, max_num_seqs=256, num_gpu_blocks=10**6, block_size=16,
        max_model_len=None, replicas=1):
    """Run requests given as (id, arrival_s, prompt, output) tuples; return {id: Request} and the engine."""
    rs = [Request(i, rid, a, p, o, record_token_times=True) for i, (rid, a, p, o) in enumerate(reqs)]
    eng = Engine(cost, get_scheduler_factory(scheduler), SchedulerConfig(max_num_seqs, budget),
                 EngineConfig(num_gpu_blocks, block_size, max_model_len, True, True), num_replicas=replicas)
    eng.run(rs)
    return {r.request_id: r for r in rs}, eng


def replica_options(scheduler: str, replicas: int) -> dict:
    """``replicas`` engines in the form ``scheduler`` takes them: a prefill and a decode pool of
    that many each for ``disagg``, else ``replicas`` engines behind the router."""
    if scheduler == "disagg":
        return {"prefill_replicas": replicas, "decode_replicas": replicas}
    return {"replicas": replicas}


def replay_both_paths(trace, cost, atol=1e-9, **config):
    """Replay ``trace`` step by step (``exact_steps``) and on the fast path; assert they agree.

    Same step count, statuses and preemption counts, and every token time within ``atol``
    seconds (0: identical). Returns both results ``(exact, fast)``.
    """
    import numpy as np

    from replay.config import RecordOptions, ReplayConfig
    from replay.simulate import replay_frame

    record = RecordOptions(**{k.removeprefix("record_"): config.pop(k) for k in list(config)
                              if k.startswith("record_")})
    slow, e1 = replay_frame(trace, cost, ReplayConfig.from_options(record, exact_steps=True, **config))
    fast, e2 = replay_frame(trace, cost, ReplayConfig.from_options(record, **config))
    assert e1.num_steps == e2.num_steps
    assert slow["pred_status"].tolist() == fast["pred_status"].tolist()
    assert slow["pred_num_preemptions"].tolist() == fast["pred_num_preemptions"].tolist()
    for a, b in zip(slow["pred_token_times_s"], fast["pred_token_times_s"]):
        if a is None:
            assert b is None
            continue
        assert len(a) == len(b)
        assert np.max(np.abs(np.asarray(a) - np.asarray(b)), initial=0.0) <= atol
    return slow, fast


def write_calibration(cost_model, path, **params) -> None:
    """Write a calibration file holding ``cost_model``'s hardware, terms and parameter
    values (``params`` override some, natural units)."""
    values = {**{k: v for k, v in cost_model.params.items() if v == v}, **params}
    Calibration(cost_model.model, cost_model.gpu, cost_model.tp, {k: FittedParam(v) for k, v in values.items()},
                terms=list(cost_model.terms), dp=cost_model.dp,
                expert_parallel=cost_model.expert_parallel).write(path)


def write_content(path, content, missing: str = "absent") -> None:
    """Put ``content`` at ``path``: bytes or text as given; None leaves no file (``missing``
    "absent", removing one) or a folder in its place (``missing`` "folder")."""
    if content is None:
        if missing == "folder":
            path.mkdir()
        elif path.exists():
            path.unlink()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def invoke_servecal(*args):
    """Run ``servecal ARGS...`` in-process (click's runner); assert it ends in an exit code, not
    an exception or a traceback; return the result."""
    from click.testing import CliRunner

    from calibrate.umbrella import main as servecal

    res = CliRunner().invoke(servecal, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    return res


def flat(text: str) -> str:
    """``text`` with every run of whitespace one space (messages folded at 100 columns)."""
    return " ".join(text.split())
