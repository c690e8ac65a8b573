"""The step record: what one forward pass (step) of one replica is, declared once.

A step is described by the fields of :data:`STEP_RECORD`: where and when it ran, how long it
took, and its *features* (:data:`STEP_FEATURES`), the aggregates of its batch that the cost
model prices. The engine records a step as a plain tuple in this order (cheap in its hot
loop); the step trace's columns (:data:`schemas.tables.STEP_COLUMNS`), the fits' inputs, the
cost model's arguments and every reader that wants a field by name (:class:`StepRow`,
:data:`FIELD_INDEX`) come from this one declaration. A feature's name is also the attribute
of the engine's batch (:class:`replay.schedulers.base.Batch`) that holds it and the keyword
of :meth:`replay.cost.cost_model.RooflineCostModel.step_time_s`.

Adding a feature: one :class:`StepField` in :data:`STEP_FEATURES` (the batch keeps its
aggregate), then a cost term that reads it (:mod:`replay.cost.cost_terms`).
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from operator import attrgetter

import numpy as np


@dataclass(frozen=True)
class StepField:
    """One field of the step record.

    Attributes
    ----------
    name : str
        Column of the step trace (unit as suffix: ``_s`` seconds; token and sequence counts
        are int64).
    unit : str
        ``"s"``, ``"tokens"``, ``"sequences"`` or ``""`` (an index).
    symbol : str
        Its letter in the cost model's formulas (``""``: not a feature).
    doc : str
        What it counts, and its source.
    required : bool
        Whether a step trace file must have the column; an optional feature missing from a
        file takes its :attr:`default`.
    default : str
        How an absent optional feature is filled: ``"zero"``, ``"one_per_prefill"`` (1 when the
        step has prefill tokens, else 0) or ``"num_decode_seqs"`` (equal to that feature).
    """

    name: str
    unit: str
    symbol: str
    doc: str
    required: bool = True
    default: str = "zero"

    @property
    def is_time(self) -> bool:
        """Whether the field is in seconds (float64; the others are int64)."""
        return self.unit == "s"


#: Where and when a step ran, and how long it took.
STEP_WHERE_WHEN = (
    StepField("replica_id", "", "", "the replica (engine) that ran the step"),
    StepField("step_start_time_s", "s", "", "start of the step, seconds since the trace start"),
    StepField("step_duration_s", "s", "", "duration of the step (forward pass, sampling, scheduling), seconds"),
)

#: The features of a step: the aggregates of its batch the cost model prices.
STEP_FEATURES = (
    StepField("num_prefill_tokens", "tokens", "P", "prompt tokens computed in the step (all chunks)"),
    StepField("num_prefill_seqs", "sequences", "S", "prefill chunks (sequences prefilling) in the step",
              default="one_per_prefill"),
    StepField("num_decode_seqs", "sequences", "D", "sequences decoding in the step"),
    StepField("decode_context_tokens", "tokens", "C_d",
              "sum of the context lengths of the decoding sequences (the seed's L_total)"),
    StepField("prefill_context_tokens", "tokens", "C_p",
              "KV history the prefill chunks attend to (cached or earlier-chunk tokens)", required=False),
    StepField("num_decode_tokens", "tokens", "Q",
              "positions the decodes feed: one each plus the draft tokens they verify (speculative "
              "decoding, vLLM's num_speculative_tokens); equal to num_decode_seqs without it", required=False,
              default="num_decode_seqs"),
)

#: Every field of a step, in record (and column) order.
STEP_RECORD = STEP_WHERE_WHEN + STEP_FEATURES
#: Names of the features, in record order.
FEATURE_NAMES = tuple(f.name for f in STEP_FEATURES)
#: Position of each field in a recorded step tuple.
FIELD_INDEX = {f.name: i for i, f in enumerate(STEP_RECORD)}
#: A recorded step read by name (``StepRow._make(t)`` of an engine's tuple ``t``).
StepRow = namedtuple("StepRow", [f.name for f in STEP_RECORD])  # type: ignore[misc]  # fields: STEP_RECORD

#: The features of an object that holds them as attributes of the same names (the engine's
#: batch), as a tuple in record order: ``(rid, start, duration) + step_features(batch)`` is a
#: recorded step.
step_features = attrgetter(*FEATURE_NAMES)

_CONTEXT = FEATURE_NAMES.index("decode_context_tokens")


def around_decode_context(features: tuple) -> tuple[tuple, tuple]:
    """The features before and after ``decode_context_tokens`` (a run of decode steps that
    differ only in it is recorded as ``before + (context,) + after``)."""
    return features[:_CONTEXT], features[_CONTEXT + 1:]


def feature_arrays(columns) -> dict[str, np.ndarray]:
    """The features of a step trace's rows, by name, as int64 arrays.

    Parameters
    ----------
    columns : mapping name -> array-like (a pandas DataFrame works)
        The required features' columns, and the optional ones it has (nulls in an optional
        column count as absent there).

    Returns
    -------
    dict
        Every feature of :data:`STEP_FEATURES`; an absent optional one filled by its
        :attr:`StepField.default`.
    """
    out: dict[str, np.ndarray] = {}
    num_rows = len(columns[STEP_FEATURES[0].name])  # the first feature is required
    for f in STEP_FEATURES:  # in record order: a default refers to an earlier feature
        given = np.asarray(columns[f.name], float) if f.name in columns else None
        if f.default == "one_per_prefill":
            fill = (out["num_prefill_tokens"] > 0).astype(np.int64)
        elif f.default == "num_decode_seqs":
            fill = out["num_decode_seqs"]
        else:
            fill = np.zeros(num_rows, np.int64)
        out[f.name] = fill if given is None else np.where(np.isnan(given), fill, given).astype(np.int64)
    return out
