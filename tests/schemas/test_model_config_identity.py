"""A model read from a Hugging Face config.json (issue 21, items 4 and 5): named by the file
(``_name_or_path``, else ``architectures``), else after its folder with a note that the name
is a guess; a config that extends a supported type (DeepSeek-V3.2's ``deepseek_v32``) is read
as that type, with one warning line naming what is ignored."""
import json
import warnings

import pytest
from click.testing import CliRunner

from calibrate.umbrella import main as servecal
from helpers import write_calibration
from replay.cost.cost_model import RooflineCostModel
from schemas.cost_params import CostParams
from schemas.errors import SpecError
from schemas.hf_identity import SpecNote
from schemas.specs import get_gpu, get_model, model_from_hf_config

#: deepseek-ai/DeepSeek-V3.2-Exp's config.json, the fields a reader meets: a DeepSeek-V3 config
#: plus the lightning indexer of DeepSeek Sparse Attention (index_n_heads, index_head_dim, index_topk).
DEEPSEEK_V32 = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
    "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
    "routed_scaling_factor": 2.5, "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128,
    "vocab_size": 129280, "max_position_embeddings": 163840, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
}
INDEXER = ("index_n_heads", "index_head_dim", "index_topk")


def write(folder, cfg):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder / "config.json"


def read(path):
    """The spec, and the notes the reader raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SpecNote)
        spec = model_from_hf_config(path)
    return spec, [str(w.message) for w in caught if issubclass(w.category, SpecNote)]


# --- item 5: a config that extends a supported type ----------------------------------------------

def test_deepseek_v32_is_read_as_deepseek_v3_naming_the_indexer(tmp_path):
    path = write(tmp_path / "E", DEEPSEEK_V32)
    v32, notes = read(path)
    v3, v3_notes = read(write(tmp_path / "v3", {**{k: v for k, v in DEEPSEEK_V32.items() if k not in INDEXER},
                                                "model_type": "deepseek_v3",
                                                "architectures": ["DeepseekV3ForCausalLM"]}))
    assert v3_notes == []
    # every part we model (MLA, MoE, sizes) as the DeepSeek-V3 reading of the same shapes
    assert v32 == v3.__class__(**{**v3.__dict__, "name": "DeepseekV32ForCausalLM"})
    assert (v32.kv_lora_rank, v32.qk_rope_head_dim, v32.num_experts, v32.num_experts_per_token) == (512, 64, 256, 8)
    assert v32.num_moe_layers == 58 and v32.max_model_len == 163840
    assert v32.kv_bytes_per_token == 61 * (512 + 64) * 2
    assert v32.num_params == pytest.approx(671e9, rel=0.01)  # DeepSeek-V3's 671B without the MTP layer
    assert v32.num_active_params == pytest.approx(37e9, rel=0.02)
    assert notes == [f"{path}: model_type 'deepseek_v32' read as deepseek_v3; ignored: DeepSeek Sparse Attention's "
                     "indexer (index_n_heads, index_head_dim, index_topk): attention costed dense, the indexer not "
                     "at all"]


def test_an_own_model_type_over_a_supported_architecture_is_read_as_it(tmp_path):
    """Kimi-K2 style: its own model_type, the code of DeepseekV3ForCausalLM."""
    cfg = {**{k: v for k, v in DEEPSEEK_V32.items() if k not in INDEXER}, "model_type": "kimi_k2",
           "architectures": ["DeepseekV3ForCausalLM"]}
    spec, notes = read(write(tmp_path / "k2", cfg))
    assert spec.kv_lora_rank == 512 and spec.num_experts == 256
    assert notes == [f"{tmp_path / 'k2' / 'config.json'}: model_type 'kimi_k2' read as deepseek_v3, the type of its "
                     "architecture DeepseekV3ForCausalLM; ignored: whatever 'kimi_k2' adds to deepseek_v3"]


def test_an_unknown_type_is_still_refused_naming_the_file(tmp_path):
    path = write(tmp_path / "x", {**DEEPSEEK_V32, "model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"]})
    with pytest.raises(SpecError, match=r"config\.json: model_type 'mamba2' is not supported; supported: .*"
                                        r"types that extend one \(deepseek_v32, or architectures"):
        model_from_hf_config(path)


# --- item 4: the name ------------------------------------------------------------------------------

@pytest.mark.parametrize("extra,name", [
    ({"_name_or_path": "deepseek-ai/DeepSeek-V3.2-Exp"}, "deepseek-ai/DeepSeek-V3.2-Exp"),
    ({"_name_or_path": "/data/models/E"}, "DeepseekV32ForCausalLM"),  # a machine's folder is no model name
    ({}, "DeepseekV32ForCausalLM"),
])
def test_the_name_comes_from_the_file(tmp_path, extra, name):
    spec, notes = read(write(tmp_path / "E", {**DEEPSEEK_V32, **extra}))
    assert spec.name == name
    assert not [n for n in notes if "named" in n]


def test_a_name_from_the_folder_is_said_to_be_a_guess(tmp_path):
    cfg = {k: v for k, v in DEEPSEEK_V32.items() if k != "architectures"}
    path = write(tmp_path / "E", cfg)
    spec, notes = read(path)
    assert spec.name == "E"
    assert notes[-1] == (f"{path}: neither _name_or_path nor architectures in the file; the model is named 'E' "
                         "after its folder, a guess")
    # a Hugging Face cache snapshot (a 40-hex folder): after model_type, still a guess
    snap = write(tmp_path / "snapshots" / ("ab" * 20), cfg)
    spec, notes = read(snap)
    assert spec.name == "deepseek_v32" and notes[-1].endswith("the model is named 'deepseek_v32' after its folder, "
                                                              "a guess")


# --- the commands: one warning line each, the model named in the output ---------------------------

def test_the_commands_say_each_note_once_on_one_line(tmp_path, monkeypatch):
    import pandas as pd

    from schemas.tables import REQUEST_TRACE, to_table, write_table

    monkeypatch.chdir(tmp_path)
    small = {**DEEPSEEK_V32, "num_hidden_layers": 4}  # 3 dense layers and 1 MoE: fits one GPU
    write(tmp_path / "E", {k: v for k, v in small.items() if k != "architectures"})
    df = pd.DataFrame({"request_id": ["a", "b"], "arrival_time_s": [0.0, 1.0], "num_prompt_tokens": [100, 200],
                       "num_output_tokens": [5, 6]})
    write_table(to_table(REQUEST_TRACE, df), tmp_path / "t.parquet")
    write_calibration(RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h200"), CostParams()),
                      tmp_path / "cal.json")
    res = CliRunner().invoke(servecal, ["replay", "t.parquet", "--calibration", "cal.json", "--model", "E"])
    assert res.exit_code == 0, res.output
    lines = [line for line in res.stderr.splitlines() if line.startswith("warning: ")]
    assert [line.split(": ", 2)[2][:42] for line in lines] == ["model_type 'deepseek_v32' read as deepseek",
                                                               "neither _name_or_path nor architectures in"]
    text = " ".join(res.stderr.split())
    assert "index_n_heads, index_head_dim, index_topk" in text and "named 'E' after its folder, a guess" in text
