"""Spec types: what the cost model needs from a GPU (its peaks per precision) and a link.

:class:`GpuSpec` and :class:`Link` are plain frozen dataclasses with validation; ``GpuSpec`` is
part of the calibration file's contract (``to_dict`` / ``from_dict``). Where the values come
from (the catalog's datasheet figures) is the business of :mod:`schemas.spec_catalog`.

Every problem is raised as :class:`~schemas.errors.SpecError` with one clear message.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .dtypes import GEMM_PRECISIONS
from .errors import SpecError
from .spec_checks import build_checked, check_number


@dataclass(frozen=True)
class GpuSpec:
    """What the cost model needs to know about one GPU.

    Attributes
    ----------
    name : str
        Catalog key (e.g. ``"rtx-pro-6000"``) or the name given in a spec file.
    peak_flops : float
        Dense BF16 tensor-core peak, no structured sparsity [FLOP/s].
    peak_flops_fp8, peak_flops_fp4 : float, optional
        Dense FP8 and FP4 tensor-core peaks [FLOP/s]; 0 for a GPU without native FP8/FP4
        tensor cores (the default: calibration files written before the fields load as BF16
        only). See :meth:`peak_flops_for`.
    mem_bandwidth_bytes_per_s : float
        Datasheet DRAM bandwidth (HBM or GDDR) [bytes/s].
    mem_bytes : float
        DRAM capacity [bytes]. The catalog reads a datasheet "80 GB" as 80 GiB, since GPU
        memory is built from binary-sized DRAM (an A100 80GB reports 81920 MiB).
    tp_link : str
        Interconnect between GPUs of one tensor-parallel replica, a link preset of the
        catalog (:func:`schemas.spec_catalog.get_link`: ``nvlink4`` on H100 SXM, ``pcie5``
        on a PCIe card...).

    Raises
    ------
    SpecError
        On construction, naming the field, for a missing, non-numeric or non-positive value
        (negative, for the FP8/FP4 peaks).
    """

    name: str
    peak_flops: float
    mem_bandwidth_bytes_per_s: float
    mem_bytes: float
    tp_link: str = "pcie4"
    peak_flops_fp8: float = 0.0
    peak_flops_fp4: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SpecError(f"gpu spec: field 'name' must be a non-empty string, got {self.name!r}")
        where = f"gpu spec '{self.name}'"
        for f in ("peak_flops", "mem_bandwidth_bytes_per_s", "mem_bytes"):
            check_number(getattr(self, f), f, where)
        for f in ("peak_flops_fp8", "peak_flops_fp4"):
            check_number(getattr(self, f), f, where, strict=False)

    def peak_flops_for(self, precision: str) -> float:
        """The dense tensor-core peak GEMMs of ``precision`` run at on this GPU [FLOP/s].

        Parameters
        ----------
        precision : str
            ``"bf16"``, ``"fp8"`` or ``"fp4"`` (a model's ``gemm_precision``).

        Raises
        ------
        SpecError
            For any other precision, naming the expected ones.

        Notes
        -----
        A precision the GPU has no tensor cores for (peak 0) falls back to the BF16 peak, not
        to the next narrower one it has: that is what vLLM runs. On Hopper an NVFP4 or MXFP4
        checkpoint runs weight-only (Marlin W4A16: FP4 weights dequantised to BF16 in the
        kernel), not in FP8; on Ampere (A100, A10G: no FP8) an FP8 W8A8 checkpoint runs Marlin
        W8A16, BF16 math. The FP4 peak is the GPU's FP4 rate whatever the block format (NVFP4
        on Blackwell, MXFP4 on MI355X).
        """
        peaks = {"bf16": self.peak_flops, "fp8": self.peak_flops_fp8, "fp4": self.peak_flops_fp4}
        if precision not in peaks:
            raise SpecError(f"gpu spec '{self.name}': precision {precision!r} is not one of "
                            f"{', '.join(GEMM_PRECISIONS)}")
        return peaks[precision] or self.peak_flops

    def to_dict(self) -> dict:
        """The spec as a JSON-ready dict (the calibration file's ``gpu`` block)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "gpu spec") -> "GpuSpec":
        """Build a spec from :meth:`to_dict` output; SpecError names the bad field."""
        return build_checked(cls, d, where)


@dataclass(frozen=True)
class Link:
    """An interconnect between GPUs or hosts.

    Attributes
    ----------
    name : str
        Preset name (``"nvlink4"``, ``"400gbe"``...) or ``"custom"``.
    bandwidth_bytes_per_s : float
        Bandwidth in one direction [bytes/s] (may be ``inf`` for an ideal link in tests).
    latency_s : float
        One-way latency of one transfer [s].
    fully_connected : bool
        Every GPU of a group reaches every other directly (NVLink through NVSwitch, AMD's
        Infinity Fabric mesh): a small all-reduce then takes the same few steps at any group size
        (vLLM's custom all-reduce; :class:`replay.cost.comm_terms.TensorParallelComm`). False
        (default) for PCIe and networks, where a ring's steps grow with the group.
    """

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    fully_connected: bool = False
