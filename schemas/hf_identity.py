"""What a Hugging Face ``config.json`` says a model is: its name, and the supported
``model_type`` it is read as.

A config may extend a supported type (DeepSeek-V3.2's ``deepseek_v32`` is DeepSeek-V3 plus
the lightning indexer of its sparse attention) or declare its own ``model_type`` over the
code of a supported architecture (Kimi-K2: ``kimi_k2``, ``DeepseekV3ForCausalLM``): it is read
as that type, and a note names what is not modelled. The notes are :class:`SpecNote`
warnings; the commands print each as one ``warning:`` line
(:func:`traces.cli.support.user_errors`).

Sources: the ``config.json`` of deepseek-ai/DeepSeek-V3.2-Exp (``index_n_heads`` 64,
``index_head_dim`` 128, ``index_topk`` 2048 over a DeepSeek-V3 config); Transformers'
``*ForCausalLM`` class names of the supported types.
"""
from __future__ import annotations

import re

#: model_type -> (the supported type it extends, the keys it adds, what they are, how the cost
#: model treats it). Read as the base type; the note names the keys the config holds.
EXTENDED_MODEL_TYPES = {
    "deepseek_v32": ("deepseek_v3", ("index_n_heads", "index_head_dim", "index_topk"),
                     "DeepSeek Sparse Attention's indexer", "attention costed dense, the indexer not at all"),
}

#: Hugging Face architecture class -> the supported model_type whose code it is.
ARCHITECTURE_TYPES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2", "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "DeepseekForCausalLM": "deepseek", "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3", "OPTForCausalLM": "opt",
}


class SpecNote(UserWarning):
    """How a spec file was read where the reader had to choose (a type read as another, a
    name guessed): said to the user, not an error."""


def read_as_type(cfg: dict, supported: set, where: str) -> tuple[dict, str | None]:
    """``cfg`` as a config of a supported ``model_type``, and a note when it was read as another.

    Parameters
    ----------
    cfg : dict
        A parsed ``config.json``.
    supported : set of str
        The model_type values the reader knows (lower case).
    where : str
        The file, for the note.

    Returns
    -------
    (cfg, note) : ``cfg`` itself and None for a supported (or absent) type, else a copy whose
        ``model_type`` is the supported type it extends (:data:`EXTENDED_MODEL_TYPES`) or whose
        code its first ``architectures`` entry names (:data:`ARCHITECTURE_TYPES`), and one line
        naming what is ignored. An unknown type stays as it is (the reader refuses it).
    """
    model_type = str(cfg.get("model_type") or "llama").lower()
    if model_type in supported:
        return cfg, None
    if model_type in EXTENDED_MODEL_TYPES:
        base, keys, what, priced = EXTENDED_MODEL_TYPES[model_type]
        held = [k for k in keys if k in cfg]
        ignored = f"{what} ({', '.join(held)})" if held else what
        return ({**cfg, "model_type": base},
                f"{where}: model_type '{model_type}' read as {base}; ignored: {ignored}: {priced}")
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch in ARCHITECTURE_TYPES:
        base = ARCHITECTURE_TYPES[arch]
        return ({**cfg, "model_type": base},
                f"{where}: model_type '{model_type}' read as {base}, the type of its architecture {arch}; "
                f"ignored: whatever '{model_type}' adds to {base}")
    return cfg, None


def config_name(cfg: dict, folder: str, where: str) -> tuple[str, str | None]:
    """The name of the model of ``cfg``, and a note when it is a guess.

    The file's own ``_name_or_path`` when it is a Hub id (``org/name``; a local path names a
    machine's folder, not a model), else its first ``architectures`` entry, else ``folder``
    (the name of the folder holding the file, or ``model_type`` for a cache snapshot): a
    guess, and the note says so.
    """
    hub = cfg.get("_name_or_path")
    if isinstance(hub, str) and re.fullmatch(r"[\w.-]+(/[\w.-]+)?", hub.strip()) and not hub.startswith("."):
        return hub.strip(), None
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str) and archs[0].strip():
        return archs[0].strip(), None
    return folder, (f"{where}: neither _name_or_path nor architectures in the file; the model is named "
                    f"'{folder}' after its folder, a guess")
