"""Spec types: what the cost model and the KV-cache sizing need from a model.

:class:`ModelSpec` is a plain frozen dataclass with validation, part of the calibration file's
contract (``to_dict`` / ``from_dict``); the GPU's and the link's types are in
:mod:`schemas.gpu_types`. Where the values come from (the catalog, a Hugging Face
``config.json``) is the business of :mod:`schemas.spec_catalog` and :mod:`schemas.hf_config`.

Every problem is raised as :class:`~schemas.errors.SpecError` with one clear message.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from .dtypes import GEMM_PRECISIONS, kv_cache_dtype_bytes
from .errors import SpecError
from .spec_checks import build_checked, check_number, int_if_whole, validate_model_spec


# --------------------------------------------------------------------------- ModelSpec

@dataclass(frozen=True)
class ModelSpec:
    """What the cost model and the KV-cache sizing need to know about a model.

    Fields after ``num_experts_per_token`` were added later and have defaults, so calibration
    files written before them (which hold ``to_dict()``) still load with :meth:`from_dict`.

    Attributes
    ----------
    name : str
        Catalog key (e.g. ``"llama-3.1-8b"``) or the name of the config it came from.
    num_params : float
        Total parameter count P, all weights including embeddings [parameters].
    num_active_params : float
        Parameters touched per token [parameters]; equals ``num_params`` for a dense model,
        fewer for a mixture-of-experts model (routed experts not chosen are skipped).
    num_layers : int
        Decoder layers.
    hidden_size : int
        Model width [elements].
    num_attention_heads : int
        Query heads.
    num_kv_heads : int
        Key/value heads (fewer than query heads under grouped-query attention). For MLA the
        config's ``num_key_value_heads`` (the heads the latent is expanded to), unused by the
        KV size.
    head_dim : int
        Width of one attention head [elements] (MLA: the query/key head width
        ``qk_nope_head_dim + qk_rope_head_dim``).
    dtype_bytes : int
        Bytes per activation element, the size all-reduces move (2 for bf16/fp16); the
        config's ``torch_dtype``. Before ``weight_dtype_bytes``/``kv_dtype_bytes`` existed it
        also stood for both, which is still their default.
    max_model_len : int
        Context length, ``max_position_embeddings`` of the config [tokens].
    num_experts : int
        Routed experts per MoE layer; 0 for a dense model.
    num_experts_per_token : int
        Routed experts each token uses; 0 for a dense model.
    weight_dtype_bytes : float, optional
        Bytes per weight [bytes]: 1 for fp8/int8, 0.5 for 4-bit (AWQ, GPTQ, int4), 0.5625 for
        NVFP4; default ``dtype_bytes``. Integer formats' scales are not counted, FP4 formats'
        are (:func:`schemas.dtypes.weight_format`). The routed experts' are
        ``expert_weight_dtype_bytes``.
    kv_dtype_bytes : float, optional
        Bytes per KV-cache element [bytes]: 1 for an fp8 KV cache; default ``dtype_bytes``
        (vLLM's ``--kv-cache-dtype auto``).
    intermediate_size : int
        Width of the dense MLP [elements]; 0 if unknown. Informative only: the weights and
        FLOPs come from ``num_params``, counted per architecture (a gated 3-matrix MLP for
        Llama-style models, OPT's 2-matrix ReLU FFN of width ``ffn_dim``:
        :func:`schemas.hf_config.count_params`).
    moe_intermediate_size : int
        Width of one routed expert's MLP [elements]; 0 for a dense model or if unknown.
    vocab_size : int
        Vocabulary size [tokens]; 0 if unknown.
    num_moe_layers : int, optional
        Decoder layers with routed experts; default ``num_layers`` for MoE, 0 for dense.
    kv_lora_rank : int
        Multi-head latent attention (DeepSeek-V2/V3): width of the compressed KV latent
        [elements]; 0 for ordinary attention.
    qk_rope_head_dim : int
        MLA: width of the decoupled RoPE key, shared by all heads and cached [elements].
    qk_nope_head_dim : int
        MLA: width of the non-RoPE part of each query/key head [elements].
    v_head_dim : int
        MLA: width of each value head [elements].
    num_window_layers : int
        Layers whose attention sees only the last ``sliding_window_tokens`` tokens (gpt-oss
        alternates them with full attention, Gemma 3 has five to one); 0 for none. Their KV is
        counted per sequence, at the window, not per context token (:attr:`seq_state_bytes_per_rank`).
    sliding_window_tokens : int
        The window of those layers [tokens]; 0 without windowed layers.
    num_linear_layers : int
        Linear-attention layers (Qwen3-Next's Gated DeltaNet): no KV cache, a state of constant
        size per sequence; 0 for none.
    linear_state_bytes : float
        One sequence's state in ONE linear-attention layer (recurrent state plus convolution
        window) [bytes]; 0 without linear layers.
    linear_flops_per_token : float
        FLOPs one token spends in ONE linear-attention layer outside its projections (the state
        update and read-out, the short convolution) [FLOP/token]; 0 without linear layers.
    expert_weight_dtype_bytes : float, optional
        Bytes per weight of the routed experts [bytes]; default ``weight_dtype_bytes``.
        gpt-oss's MXFP4 experts: 0.53125 (4-bit E2M1 plus an 8-bit scale per 32), the rest of
        the model in its ``torch_dtype``.
    gemm_precision : str
        The precision the linear layers' GEMMs multiply in where the GPU has it: ``"bf16"``
        (default; also every weight-only quantisation, dequantised to BF16 in the kernel),
        ``"fp8"`` (W8A8 FP8) or ``"fp4"`` (W4A4 NVFP4). The cost model prices the GEMMs at
        :meth:`schemas.gpu_types.GpuSpec.peak_flops_for` of it.
    expert_gemm_precision : str, optional
        The precision the routed experts' GEMMs multiply in; default ``gemm_precision``. An
        engine setting more than a checkpoint's: gpt-oss's MXFP4 experts run W4A16 (``"bf16"``)
        under Marlin on Hopper, but MXFP4 x MXFP8 (``"fp8"``: the FP8 tensor-core rate) with vLLM's
        FlashInfer MoE on Blackwell (``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1``, InferenceMAX's
        ``benchmarks/gptoss_fp4_b200_docker.sh``).

    Raises
    ------
    SpecError
        On construction, naming the field, when a value is missing, of the wrong type, out of
        range or inconsistent with another (active > total, kv heads > heads, experts...).
    """

    name: str
    num_params: float
    num_active_params: float
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    max_model_len: int
    num_experts: int = 0
    num_experts_per_token: int = 0
    # None (the default): ``dtype_bytes``, set by __post_init__; a number once constructed
    weight_dtype_bytes: float = None  # type: ignore[assignment]
    kv_dtype_bytes: float = None  # type: ignore[assignment]
    intermediate_size: int = 0
    moe_intermediate_size: int = 0
    vocab_size: int = 0
    num_moe_layers: int = None  # type: ignore[assignment]  # None: derived by __post_init__
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    num_window_layers: int = 0
    sliding_window_tokens: int = 0
    num_linear_layers: int = 0
    linear_state_bytes: float = 0.0
    linear_flops_per_token: float = 0.0
    expert_weight_dtype_bytes: float = None  # type: ignore[assignment]  # None: weight_dtype_bytes
    gemm_precision: str = "bf16"
    expert_gemm_precision: str = None  # type: ignore[assignment]  # None: gemm_precision

    def __post_init__(self) -> None:
        validate_model_spec(self, GEMM_PRECISIONS)

    # ----------------------------------------------------------------------- KV cache

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (DeepSeek-V2/V3): a compressed KV latent."""
        return self.kv_lora_rank > 0

    @property
    def num_full_layers(self) -> int:
        """Layers whose KV grows with the context: all but the windowed and linear-attention ones."""
        return self.num_layers - self.num_window_layers - self.num_linear_layers

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token of context occupies across the full-attention layers, D_kv
        [bytes/token].

        Notes
        -----
        ``2 * num_full_layers * num_kv_heads * head_dim * kv_dtype_bytes`` (keys and values; seed
        theory.md section 1; KV heads, not query heads, and the config's ``head_dim``, not
        hidden/heads: case NC-01). MLA caches one latent per token and layer, no per-head
        keys or values: ``num_layers * (kv_lora_rank + qk_rope_head_dim) * kv_dtype_bytes``
        (DeepSeek-V2 paper, section 2.1.2; vLLM's MLA KV spec: head size 576 for 512 + 64).
        Windowed and linear-attention layers hold a bounded amount per sequence instead
        (:meth:`seq_state_bytes_per_rank`).
        """
        if self.is_mla:
            return int_if_whole(self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * self.kv_dtype_bytes)
        return int_if_whole(self.num_full_layers * self._kv_bytes_per_token_layer(1))

    def kv_bytes_per_token_per_rank(self, tp: int) -> float:
        """KV-cache bytes one token occupies on each GPU of a ``tp``-way replica [bytes/token].

        Parameters
        ----------
        tp : int
            Tensor-parallel degree (>= 1).

        Raises
        ------
        SpecError
            If ``tp`` is not a positive integer.

        Notes
        -----
        Each rank holds ``max(1, num_kv_heads // tp)`` KV heads: beyond as many ranks as KV
        heads the heads are replicated, not split further (case NC-01: 8 KV heads at TP 16
        keep 1 head per rank). MLA's latent is not split by heads: every rank holds all of it.
        """
        check_number(tp, "tp", f"model spec '{self.name}'", integer=True)
        if self.is_mla:
            return self.kv_bytes_per_token
        return int_if_whole(self.num_full_layers * self._kv_bytes_per_token_layer(tp))

    def _kv_bytes_per_token_layer(self, tp: int) -> float:
        """Keys and values of one token in one attention layer on one of ``tp`` ranks [bytes] (``tp``
        checked by the caller)."""
        return 2 * max(1, self.num_kv_heads // int(tp)) * self.head_dim * self.kv_dtype_bytes

    def seq_state_bytes_per_rank(self, tp: int) -> float:
        """Bytes one running sequence holds on each GPU of a ``tp``-way replica whatever its
        length: the KV of its window in the windowed layers and its state in the linear-attention
        layers [bytes/sequence]; 0 for a model with full attention only.

        Raises
        ------
        SpecError
            If ``tp`` is not a positive integer (checked when the model has such layers).

        Notes
        -----
        Windowed layers: ``num_window_layers * sliding_window_tokens`` tokens of keys and values
        (the window is taken whole: exact once the sequence is longer than the window, an upper
        bound before; vLLM's hybrid KV-cache manager frees the blocks that fall out of the window,
        keeping up to one block more). Linear layers: ``num_linear_layers * linear_state_bytes / tp``
        (vLLM splits the linear-attention heads, and so their state, over the TP ranks).
        """
        if not (self.num_window_layers or self.num_linear_layers):
            return 0  # full attention only (and no check of tp on the per-transfer path)
        check_number(tp, "tp", f"model spec '{self.name}'", integer=True)
        window = self.num_window_layers * self.sliding_window_tokens * self._kv_bytes_per_token_layer(tp)
        return int_if_whole(window + self.num_linear_layers * self.linear_state_bytes / int(tp))

    def with_kv_cache_dtype(self, kv_cache_dtype: str) -> "ModelSpec":
        """A copy with the KV cache in ``kv_cache_dtype`` (vLLM's ``--kv-cache-dtype``).

        Raises
        ------
        SpecError
            For an unknown dtype name (see :func:`kv_cache_dtype_bytes`).
        """
        return replace(self, kv_dtype_bytes=kv_cache_dtype_bytes(kv_cache_dtype, self.dtype_bytes))

    # ----------------------------------------------------------------------- weights

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights, ``num_params * weight_dtype_bytes`` = P*b [bytes], the routed
        experts' parameters at ``expert_weight_dtype_bytes`` (when that differs: MXFP4 experts).

        Notes
        -----
        ``P b + R (b_expert - b)`` with ``R = num_moe_layers * num_experts * expert_params``
        the routed experts' parameters: the dense part at ``b``, the experts at ``b_expert``.
        """
        extra = self.expert_weight_dtype_bytes - self.weight_dtype_bytes
        routed = self.num_moe_layers * self.num_experts * self.expert_params if extra else 0
        return self.num_params * self.weight_dtype_bytes + routed * extra

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model."""
        return self.num_experts > 0

    @property
    def expert_params(self) -> float:
        """Parameters of ONE routed expert in ONE MoE layer [parameters]; 0 for a dense model.

        Raises
        ------
        SpecError
            When ``moe_intermediate_size`` is unknown and every expert is active.

        Notes
        -----
        Gated MLP (gate, up and down projections): ``3 * hidden_size * moe_intermediate_size``.
        When ``moe_intermediate_size`` is unknown (a spec written before the field existed) it
        is inferred from the counts: the experts a token skips hold ``num_params -
        num_active_params`` parameters, i.e. ``(P - P_active) / (num_moe_layers * (num_experts
        - num_experts_per_token))`` each.
        """
        if not self.is_moe:
            return 0
        if self.moe_intermediate_size:
            return 3 * self.hidden_size * self.moe_intermediate_size
        skipped = self.num_moe_layers * (self.num_experts - self.num_experts_per_token)
        if skipped == 0:
            raise SpecError(f"model spec '{self.name}': moe_intermediate_size is unknown and "
                            f"every expert is active, so one expert's size cannot be inferred")
        return (self.num_params - self.num_active_params) / skipped

    @property
    def active_expert_params(self) -> float:
        """Routed-expert parameters one token multiplies by, ``num_moe_layers *
        num_experts_per_token * expert_params`` [parameters]; 0 for a dense model (part of
        ``num_active_params``, priced at ``expert_gemm_precision``)."""
        return self.num_moe_layers * self.num_experts_per_token * self.expert_params if self.is_moe else 0

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes of ONE routed expert in ONE MoE layer, ``expert_params *
        expert_weight_dtype_bytes`` [bytes]; 0 for a dense model."""
        return int_if_whole(self.expert_params * self.expert_weight_dtype_bytes)

    @property
    def dense_weight_bytes(self) -> float:
        """Bytes of every weight that is not a routed expert [bytes]: attention, embeddings,
        norms, routers, shared experts and dense layers; all weights for a dense model.

        Notes
        -----
        ``weight_bytes - num_moe_layers * num_experts * expert_weight_bytes``, i.e. the
        parameters outside the routed experts at ``weight_dtype_bytes``.
        """
        return self.weight_bytes - self.num_moe_layers * self.num_experts * self.expert_weight_bytes

    # ----------------------------------------------------------------------- FLOPs

    @property
    def attention_flops_per_context_token(self) -> int:
        """FLOPs one query token spends per token of context, over the full-attention layers [FLOP/token].

        Notes
        -----
        Scores ``Q K^T`` and the weighted sum ``P V`` are each a multiply-add (2 FLOPs) per
        head per head-dimension element: ``4 * num_full_layers * num_attention_heads * head_dim``
        (the windowed and linear-attention layers: :attr:`bounded_attention_flops_per_token`).
        For MLA the query/key heads are ``qk_nope_head_dim + qk_rope_head_dim`` wide and the
        value heads ``v_head_dim`` (DeepSeek-V2's ``q_head_dim`` and ``v_head_dim``):
        ``2 * num_layers * num_attention_heads * (qk_nope + qk_rope + v_head_dim)``. That is
        the uncompressed form DeepSeek's modelling code computes (and vLLM's MLA prefill);
        vLLM's decode kernels absorb the up-projections and attend over the latent instead,
        ``2 * layers * heads * (2 * kv_lora_rank + qk_rope_head_dim)``, 3.4x as much for
        DeepSeek's 128/64/128/512 shapes.
        """
        if self.is_mla:
            return 2 * self.num_layers * self.num_attention_heads * (
                self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
        return 4 * self.num_full_layers * self.num_attention_heads * self.head_dim

    @property
    def bounded_attention_flops_per_token(self) -> float:
        """FLOPs one token spends in the layers whose attention does not grow with the context:
        the windowed layers at their whole window and the linear-attention layers [FLOP/token];
        0 for a model with full attention only.

        Notes
        -----
        ``4 * num_window_layers * num_attention_heads * head_dim * sliding_window_tokens`` (as
        :attr:`attention_flops_per_context_token` per layer, over the window: an upper bound for
        a token nearer than that to its sequence's start) plus ``num_linear_layers *
        linear_flops_per_token``.
        """
        window = 4 * self.num_window_layers * self.num_attention_heads * self.head_dim * self.sliding_window_tokens
        return int_if_whole(window + self.num_linear_layers * self.linear_flops_per_token)

    # ----------------------------------------------------------------------- contract

    def to_dict(self) -> dict:
        """The spec as a JSON-ready dict (the calibration file's ``model`` block)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "model spec") -> "ModelSpec":
        """Build a spec from :meth:`to_dict` output (also an older one, without the fields
        added later); SpecError names the bad field."""
        return build_checked(cls, d, where)
