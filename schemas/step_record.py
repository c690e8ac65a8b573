"""The step record: what one forward pass (step) of one replica is, declared once.

A step is described by the fields of :data:`STEP_RECORD`: where and when it ran, how long it
took, and its *features* (:data:`STEP_FEATURES`), the aggregates of its batch that the cost
model prices. The engine records a step as a plain tuple of its :data:`RECORDED` fields
(cheap in its hot loop); the step trace's columns (:data:`schemas.tables.STEP_COLUMNS`), the
fits' inputs, the cost model's arguments and every reader that wants a field by name
(:class:`StepRow`, :data:`FIELD_INDEX`) come from this one declaration.

A feature is *kept* or *derived*. A kept feature's name is the attribute of the engine's
batch (:class:`replay.schedulers.base.Batch`) that sums it as requests are added, and a
keyword of :meth:`replay.cost.cost_model.RooflineCostModel.step_time_s` (:data:`KEPT_NAMES`).
A derived feature is a function of the kept ones (:attr:`StepField.derive`), evaluated
wherever a step is priced: the step time computes it from its arguments (a step trace may
omit its column); the engine records the kept features and the step trace gets the derived
ones from them (:func:`derived_columns`).

Adding a derived feature and the term that prices it: one :class:`StepField` with its
``derive`` in :data:`STEP_FEATURES`, one term class (:mod:`replay.cost.cost_terms`) that
adds seconds per unit of it (``Coefficients.per_feature``), and their test. A kept feature
also needs its sum in ``Batch.add``.
"""
from __future__ import annotations

from bisect import bisect_left
from collections import namedtuple
from dataclasses import dataclass
from operator import attrgetter
from typing import Callable

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
        How an absent optional kept feature is filled: ``"zero"``, ``"one_per_prefill"`` (1 when
        the step has prefill tokens, else 0) or ``"num_decode_seqs"`` (equal to that feature).
    derive : callable or None
        None for a kept feature. For a derived one, ``derive(x) -> count``: ``x`` the kept
        features (a :data:`KeptFeatures`, Python ints or int64 arrays of one shape, with
        ``num_decode_tokens`` filled), the result of the same kind. A derived feature is
        optional in a step trace and always computed from the kept ones when priced.
    """

    name: str
    unit: str
    symbol: str
    doc: str
    required: bool = True
    default: str = "zero"
    derive: Callable | None = None

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

#: vLLM v1's CUDA-graph capture sizes, tokens, at ``--max-num-seqs`` 256 or more (its default):
#: 1, 2, 4, the multiples of 8 below 256, the multiples of 16 up to ``min(2 max_num_seqs, 512)``
#: (vLLM's ``set_cudagraph_sizes``, v0.11).
CUDAGRAPH_CAPTURE_SIZES = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))
_CAPTURE_SIZES = np.array(CUDAGRAPH_CAPTURE_SIZES)


def cudagraph_padding_tokens(x):
    """Tokens a step is padded with to replay the CUDA graph of the next capture size.

    Parameters
    ----------
    x : KeptFeatures (Python ints or int64 arrays of one shape)

    Returns
    -------
    int or int64 array
        ``size - N`` for the smallest :data:`CUDAGRAPH_CAPTURE_SIZES` ``size >= N``, ``N = P + Q``
        the step's tokens; 0 for a step of no tokens or of more than the largest size (run
        without a graph). vLLM v1 pads a step's input to the graph's size (``pad_for_cudagraph``),
        mixed and prefill steps too under its default ``FULL_AND_PIECEWISE`` mode.
    """
    n = x.num_prefill_tokens + x.num_decode_tokens
    largest = CUDAGRAPH_CAPTURE_SIZES[-1]
    if isinstance(n, np.ndarray):
        size = _CAPTURE_SIZES[np.minimum(np.searchsorted(_CAPTURE_SIZES, n), len(_CAPTURE_SIZES) - 1)]
        return np.where((n > 0) & (n <= largest), size - n, 0)
    return CUDAGRAPH_CAPTURE_SIZES[bisect_left(CUDAGRAPH_CAPTURE_SIZES, n)] - n if 0 < n <= largest else 0


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
    StepField("num_padded_tokens", "tokens", "G",
              "padding rows up to the step's CUDA-graph capture size (vLLM v1; cudagraph_padding_tokens)",
              required=False, derive=cudagraph_padding_tokens),
)

#: Every field of a step, in record (and column) order.
STEP_RECORD = STEP_WHERE_WHEN + STEP_FEATURES
#: Names of the features, in record order.
FEATURE_NAMES = tuple(f.name for f in STEP_FEATURES)
#: The kept features (summed by the batch; the step time's arguments) and the derived ones.
KEPT_FEATURES = tuple(f for f in STEP_FEATURES if f.derive is None)
DERIVED_FEATURES = tuple(f for f in STEP_FEATURES if f.derive is not None)
KEPT_NAMES = tuple(f.name for f in KEPT_FEATURES)
if FEATURE_NAMES[:len(KEPT_NAMES)] != KEPT_NAMES:
    raise TypeError("STEP_FEATURES declares the kept features first, then the derived ones")
#: The fields the engine records for a step, as a tuple in this order (the derived features
#: are computed from them when the step trace is built: :func:`derived_columns`).
RECORDED = STEP_WHERE_WHEN + KEPT_FEATURES
#: Position of each recorded field in a recorded step tuple.
FIELD_INDEX = {f.name: i for i, f in enumerate(RECORDED)}
#: A recorded step read by name (``StepRow._make(t)`` of an engine's tuple ``t``).
StepRow = namedtuple("StepRow", [f.name for f in RECORDED])  # type: ignore[misc]  # fields: RECORDED
#: The kept features by name: what a derived feature's ``derive`` reads.
KeptFeatures = namedtuple("KeptFeatures", KEPT_NAMES)  # type: ignore[misc]  # fields: KEPT_NAMES

#: The kept features of an object that holds them as attributes of the same names (the
#: engine's batch), as a tuple in record order: ``(rid, start, duration) + step_features(batch)``
#: is a recorded step.
step_features = attrgetter(*KEPT_NAMES)


def around(features: tuple, name: str) -> tuple[tuple, tuple]:
    """The kept ``features`` (a tuple in record order) before and after the one called ``name``:
    a run of steps that differ only in it (the decode or prefill context) is recorded as
    ``before + (value,) + after``."""
    i = KEPT_NAMES.index(name)
    return features[:i], features[i + 1:]


def derived_columns(kept) -> dict[str, np.ndarray]:
    """The derived features of steps, by name, as int64 arrays, in record order.

    Parameters
    ----------
    kept : mapping name -> int64 array, every kept feature (:func:`feature_arrays`'s result
        or a recorded step table's columns)
    """
    x = KeptFeatures(*(np.asarray(kept[name], np.int64) for name in KEPT_NAMES))
    return {f.name: np.asarray(f.derive(x), np.int64) for f in DERIVED_FEATURES}  # type: ignore[misc]  # derived


def feature_arrays(columns) -> dict[str, np.ndarray]:
    """The kept features of a step trace's rows (the step time's arguments), by name, as int64 arrays.

    Parameters
    ----------
    columns : mapping name -> array-like (a pandas DataFrame works)
        The required features' columns, and the optional ones it has (nulls in an optional
        column count as absent there).

    Returns
    -------
    dict
        Every kept feature (:data:`KEPT_NAMES`); an absent optional one filled by its
        :attr:`StepField.default`. A derived feature is not read: the step time computes it.
    """
    out: dict[str, np.ndarray] = {}
    num_rows = len(columns[STEP_FEATURES[0].name])  # the first feature is required
    for f in KEPT_FEATURES:  # in record order: a default refers to an earlier feature
        given = np.asarray(columns[f.name], float) if f.name in columns else None
        if f.default == "one_per_prefill":
            fill = (out["num_prefill_tokens"] > 0).astype(np.int64)
        elif f.default == "num_decode_seqs":
            fill = out["num_decode_seqs"]
        else:
            fill = np.zeros(num_rows, np.int64)
        out[f.name] = fill if given is None else np.where(np.isnan(given), fill, given).astype(np.int64)
    return out

