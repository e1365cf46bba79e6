"""Reading real Hugging Face configs: dims, heads, dtype, MLA detection, overrides."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from mla_switchboard.agent.errors import BadInputError
from mla_switchboard.agent.model_config import is_mla, load_config, read_model
from mla_switchboard.core.specs import Dtype

CONFIGS = Path(__file__).resolve().parent / "configs"


def yarn_scale(qk_head_dim: int, factor: float, mscale_all_dim: float) -> float:
    mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
    return qk_head_dim**-0.5 * mscale * mscale


@pytest.mark.parametrize(
    ("config", "dims", "heads", "model_type", "scale"),
    [
        ("deepseek-v3.json", (128, 64, 128), 128, "deepseek_v3", yarn_scale(192, 40, 1.0)),
        ("deepseek-v2-lite.json", (128, 64, 128), 16, "deepseek_v2", yarn_scale(192, 40, 0.707)),
        ("kimi-k2.json", (128, 64, 128), 64, "kimi_k2", yarn_scale(192, 32, 1.0)),
        ("glm-5", (192, 64, 256), 64, "glm_moe_dsa", 256**-0.5),
        ("kimi-k2.5-multimodal.json", (128, 64, 128), 64, "kimi_k2", yarn_scale(192, 64, 1.0)),
    ],
)
def test_real_mla_configs(
    config: str, dims: tuple[int, int, int], heads: int, model_type: str, scale: float
) -> None:
    model = read_model(CONFIGS / config)
    assert (model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim) == dims
    assert model.num_heads == heads
    assert model.dtype is Dtype.BFLOAT16
    assert model.model_type == model_type
    assert model.softmax_scale == pytest.approx(scale)


def test_model_directory_gives_its_name() -> None:
    model = read_model(CONFIGS / "glm-5")
    assert model.name == "glm-5"
    assert read_model(CONFIGS / "glm-5" / "config.json").name == "glm-5"


def test_nested_text_config_wins_over_top_level() -> None:
    config, _ = load_config(CONFIGS / "kimi-k2.5-multimodal.json")
    assert "kv_lora_rank" not in config  # only the nested text_config is MLA
    assert is_mla(config)


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (
            "llama-3.1-8b-instruct.json",
            "llama model that does not use MLA (its config has no kv_lora_rank)",
        ),
        (
            "deepseek-vl2-tiny.json",
            "deepseek_vl_v2 model that does not use MLA (it sets use_mla: false)",
        ),
    ],
)
def test_non_mla_models_are_refused(config: str, why: str) -> None:
    with pytest.raises(BadInputError, match="does not use MLA") as err:
        read_model(CONFIGS / config)
    assert why in str(err.value)


def test_use_mla_false_beats_kv_lora_rank() -> None:
    config, _ = load_config(CONFIGS / "deepseek-v3.json")
    assert not is_mla({**config, "use_mla": False})
    assert is_mla({**config, "use_mla": True})


def test_explicit_values_override_the_file() -> None:
    model = read_model(
        CONFIGS / "deepseek-v3.json",
        qk_nope_head_dim=192,
        v_head_dim=256,
        num_heads=16,
        dtype="fp16",
        name="my-model",
    )
    assert (model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim) == (192, 64, 256)
    assert (model.num_heads, model.dtype, model.name) == (16, Dtype.FLOAT16, "my-model")


def test_flags_alone_describe_a_model() -> None:
    model = read_model(qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    assert model.num_heads is None and model.dtype is None
    assert model.softmax_scale == pytest.approx(192**-0.5)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read model config"),
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "is not a JSON object"),
    ],
)
def test_unreadable_configs(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BadInputError, match=message):
        read_model(path)


def test_missing_or_bad_fields(tmp_path: Path) -> None:
    config, _ = load_config(CONFIGS / "deepseek-v3.json")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in config.items() if k != "v_head_dim"}))
    with pytest.raises(BadInputError, match=r"v_head_dim is not in .* give it with --v-head-dim"):
        read_model(path)
    assert read_model(path, v_head_dim=128).v_head_dim == 128
    path.write_text(json.dumps({**config, "torch_dtype": "float8_e4m3fn"}))
    with pytest.raises(BadInputError, match="unknown dtype 'float8_e4m3fn'"):
        read_model(path)
    path.write_text(json.dumps({**config, "qk_rope_head_dim": "64"}))
    with pytest.raises(BadInputError, match=r"qk_rope_head_dim .* must be a non-negative integer"):
        read_model(path)
    # a rope part of 0 is real (GLM-5-Next: (256, 0, 256)); a negative one is not
    path.write_text(json.dumps({**config, "qk_nope_head_dim": 256, "qk_rope_head_dim": 0}))
    assert read_model(path).qk_rope_head_dim == 0
    path.write_text(json.dumps({**config, "qk_rope_head_dim": -1}))
    with pytest.raises(BadInputError, match=r"qk_rope_head_dim .* must be a non-negative integer"):
        read_model(path)
    with pytest.raises(BadInputError, match=r"qk_nope_head_dim .* must be a positive integer"):
        read_model(path, qk_nope_head_dim=0)
