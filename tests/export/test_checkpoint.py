"""fp8mix.export: FP8 checkpoints of a tiny random-init Hugging Face Llama, written and read
back by fp8mix, by transformers (its compressed-tensors and FineGrainedFP8 loaders, local
folder, no network) and validated by the compressed_tensors library's own config model.
References not written here: ml_dtypes' E4M3 for the stored bytes, transformers' and
compressed_tensors' loaders and parsers, the FP8 model's own forward."""
from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import fp8mix  # noqa: E402
import fp8mix.export as ex  # noqa: E402
from fp8mix.recipe import CurrentScaling  # noqa: E402

# dims that are multiples of 128 where above it: transformers' CPU dequantisation of block
# FP8 derives the block from the scale grid (rows // scale_rows), exact only then
CFG = dict(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=64)
LAYOUTS = [("compressed-tensors", "tensor"), ("compressed-tensors", "channel"), ("fp8-block", "tensor")]


def _not_head(mod, fqn):
    return fqn != "lm_head"


def _llama(fp8_weights: bool = False):
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CFG)).eval()
    if fp8_weights:
        with fp8mix.fp8_model_init():
            fp8mix.convert_model(m, module_filter_fn=_not_head)
    else:
        fp8mix.convert_model(m, module_filter_fn=_not_head)
    return m


IDS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))


def _fp8_logits(m):
    with torch.no_grad(), fp8mix.fp8_autocast(enabled=True, fp8_recipe=CurrentScaling()):
        return m(IDS).logits


def _v(x) -> str:
    """An enum's value or the string pydantic stored (compressed_tensors keeps enum values)."""
    return str(getattr(x, "value", x))


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module")
def trained():
    return _llama()


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda p: f"{p[0]}-{p[1]}")
def folder(request, trained, tmp_path_factory):
    fmt, strategy = request.param
    path = tmp_path_factory.mktemp(f"{fmt}-{strategy}")
    ex.save_fp8_checkpoint(trained, path, format=fmt, strategy=strategy, activations=None)
    return fmt, strategy, str(path)


def _e4m3_reference(w: np.ndarray, layout: str):
    """(bytes as float64, scale) of the current E4M3 cast per tensor / row / 128x128 block, ml_dtypes."""
    n, k = w.shape
    if layout == "tensor":
        tiles = [(slice(0, n), slice(0, k))]
    elif layout == "channel":
        tiles = [(slice(i, i + 1), slice(0, k)) for i in range(n)]
    else:
        tiles = [(slice(i, i + 128), slice(j, j + 128)) for i in range(0, n, 128) for j in range(0, k, 128)]
    q = np.zeros_like(w, dtype=np.float64)
    scales = []
    for r, c in tiles:
        scale = np.float32(448.0) / np.float32(np.abs(w[r, c]).max())
        q[r, c] = (w[r, c] * scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
        scales.append(np.float32(1.0) / scale)
    return q, np.array(scales, dtype=np.float32)


def test_stored_bytes_and_scales_are_the_e4m3_cast_of_the_weights(folder, trained):
    from safetensors.torch import load_file

    fmt, strategy, path = folder
    layout = "block" if fmt == "fp8-block" else strategy
    tensors = load_file(os.path.join(path, ex.WEIGHTS_NAME))
    w = trained.model.layers[1].mlp.down_proj.weight.detach().float().numpy()  # [128, 256]: 2 blocks
    q, sc = _e4m3_reference(w, layout)
    key = "model.layers.1.mlp.down_proj."
    assert tensors[key + "weight"].dtype == torch.float8_e4m3fn
    assert np.array_equal(tensors[key + "weight"].float().numpy().astype(np.float64), q)
    skey = "weight_scale_inv" if layout == "block" else "weight_scale"
    assert np.allclose(tensors[key + skey].numpy().ravel(), sc, rtol=2 ** -23, atol=0)
    assert tensors["lm_head.weight"].dtype == torch.float32  # kept in high precision, named in ignore
    assert not any(k.rpartition(".")[2].startswith("fp8_") for k in tensors)  # no FP8 state buffers


def test_round_trip_into_torch_and_transformers_matches_the_fp8_model(folder, trained):
    fmt, strategy, path = folder
    ref = _fp8_logits(trained)
    plain = ex.load_fp8_checkpoint(path)  # built by transformers from config.json, dequantised weights
    assert type(plain.model.layers[0].mlp.down_proj) is torch.nn.Linear
    with torch.no_grad():
        y = plain(IDS).logits
    # the FP8 model also casts every GEMM input to E4M3 (3 mantissa bits: ~3.6% rms rounding
    # per cast) and rounds its weights per tensor, the loaded model only the weights, per
    # tensor / channel / block: logits within 10% rms of the FP8 model's (measured 3.9%,
    # 7.2%, 4.2%); the bit-exact check is test_per_tensor_round_trip_into_fp8_weights_is_bit_exact
    assert _rel(y, ref) < 0.10
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        yh = hf(IDS).logits
    # transformers dequantises the same bytes x scales (block FP8 on a CPU: to bf16 first)
    assert _rel(yh, y) < (1e-2 if fmt == "fp8-block" else 1e-6)


def test_per_tensor_round_trip_into_fp8_weights_is_bit_exact(trained, tmp_path):
    ex.save_fp8_checkpoint(trained, tmp_path, format="compressed-tensors", strategy="tensor")
    back = ex.load_fp8_checkpoint(tmp_path, _llama(fp8_weights=True))
    w = back.model.layers[0].self_attn.q_proj.weight
    assert type(w).__name__ == "FP8Weight"
    # the stored bytes are the bytes CurrentScaling casts the weight to at every forward,
    # so the FP8 model and the one holding the loaded FP8 weights compute the same thing
    assert torch.equal(_fp8_logits(back), _fp8_logits(trained))


def test_an_fp8_weight_model_exports_its_own_bytes(tmp_path):
    m = _llama(fp8_weights=True)
    ex.save_fp8_checkpoint(m, tmp_path)
    from safetensors.torch import load_file

    t = load_file(os.path.join(tmp_path, ex.WEIGHTS_NAME))
    w = m.model.layers[0].mlp.up_proj.weight
    assert torch.equal(t["model.layers.0.mlp.up_proj.weight"].view(torch.uint8), w._data.view(torch.uint8))
    assert torch.equal(t["model.layers.0.mlp.up_proj.weight_scale"], w._scale_inv.reshape(1))


def test_compressed_tensors_config_is_what_the_library_parses(folder):
    fmt, strategy, path = folder
    cfg = json.load(open(os.path.join(path, ex.CONFIG_NAME)))
    assert cfg["model_type"] == "llama" and cfg["hidden_size"] == 128
    qc = cfg["quantization_config"]
    if fmt == "fp8-block":
        assert qc == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                      "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}
        parsed = transformers.FineGrainedFP8Config.from_dict(dict(qc))
        assert list(parsed.weight_block_size) == [128, 128] and parsed.activation_scheme == "dynamic"
        return
    ct = pytest.importorskip("compressed_tensors.quantization")
    parsed = ct.QuantizationConfig.model_validate(qc)
    assert set(qc) <= set(ct.QuantizationConfig.model_fields)
    assert parsed.quant_method == "compressed-tensors" and parsed.format == "float-quantized"
    assert parsed.ignore == ["lm_head"]
    (scheme,) = parsed.config_groups.values()
    assert scheme.targets == ["Linear"] and scheme.input_activations is None
    w = scheme.weights
    assert (w.num_bits, _v(w.type), _v(w.strategy), w.symmetric) == (8, "float", strategy, True)


def test_static_and_dynamic_activation_entries(trained, tmp_path):
    ct = pytest.importorskip("compressed_tensors.quantization")
    with pytest.raises(ValueError, match="recorded input amax"):
        ex.save_fp8_checkpoint(_llama(), tmp_path / "s0", activations="static")  # never ran in FP8
    with torch.no_grad(), fp8mix.fp8_autocast(enabled=False, calibrating=True):
        trained(IDS)  # records each layer's input amax (current scaling records none)
    ex.save_fp8_checkpoint(trained, tmp_path / "s", activations="static")
    qc = json.load(open(tmp_path / "s" / ex.CONFIG_NAME))["quantization_config"]
    inp = ct.QuantizationConfig.model_validate(qc).config_groups["group_0"].input_activations
    assert inp.dynamic is False and _v(inp.strategy) == "tensor"
    from safetensors.torch import load_file

    t = load_file(os.path.join(tmp_path, "s", ex.WEIGHTS_NAME))
    lin = trained.model.layers[0].mlp.gate_proj
    assert float(t["model.layers.0.mlp.gate_proj.input_scale"]) == pytest.approx(
        float(lin.fp8_amax_history[:, 0].max()) / 448.0, rel=1e-7)
    ex.save_fp8_checkpoint(trained, tmp_path / "d")
    qc = json.load(open(tmp_path / "d" / ex.CONFIG_NAME))["quantization_config"]
    inp = ct.QuantizationConfig.model_validate(qc).config_groups["group_0"].input_activations
    assert inp.dynamic is True and _v(inp.strategy) == "token"


def test_bad_arguments_and_foreign_folders_are_refused(trained, tmp_path):
    with pytest.raises(ValueError, match="format must be one of"):
        ex.save_fp8_checkpoint(trained, tmp_path, format="gguf")
    with pytest.raises(ValueError, match="strategy"):
        ex.save_fp8_checkpoint(trained, tmp_path, strategy="block")
    with pytest.raises(ValueError, match="dynamic activations only"):
        ex.save_fp8_checkpoint(trained, tmp_path, format="fp8-block", activations="static")
    with pytest.raises(TypeError, match="nn.Module"):
        ex.save_fp8_checkpoint({"w": torch.ones(2)}, tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        ex.load_fp8_checkpoint(tmp_path / "nothing")
    ex.save_fp8_checkpoint(trained, tmp_path / "ok")
    cfg = json.load(open(tmp_path / "ok" / ex.CONFIG_NAME))
    cfg["quantization_config"]["quant_method"] = "awq"
    json.dump(cfg, open(tmp_path / "ok" / ex.CONFIG_NAME, "w"))
    with pytest.raises(ValueError, match="quant_method 'awq'"):
        ex.load_fp8_checkpoint(tmp_path / "ok")
    with pytest.raises(ValueError, match="does not fit the model"):
        ex.save_fp8_checkpoint(trained, tmp_path / "ok2")
        ex.load_fp8_checkpoint(tmp_path / "ok2", torch.nn.Sequential(torch.nn.Linear(4, 4)))


def test_import_fp8mix_does_not_import_export():
    import subprocess
    import sys

    code = "import sys, fp8mix; print('fp8mix.export' in sys.modules, 'safetensors' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.split()[-2:] == ["False", "False"]
