"""The LLaMA-style model: presets, shapes, causal masking, stages composing to the whole model."""

import pytest
import torch

from skippipe.errors import UserError
from skippipe.model.config import PRESETS, ModelConfig, get_preset, model_config_from_dict
from skippipe.model.llama import Llama, build_stage

torch.set_num_threads(1)

CFG = ModelConfig(vocab_size=97, d_model=32, n_layers=6, n_heads=4, n_kv_heads=2, ffn_dim=64, ctx=24, seed=3)


def test_presets():
    assert 1e6 < PRESETS["tiny"].num_params() < 10e6
    big = get_preset("llama-500m")
    assert (big.d_model, big.n_heads, big.n_layers, big.ctx) == (1024, 16, 24, 1024)
    assert 4e8 < big.num_params() < 6e8
    assert 1.2e9 < get_preset("llama-1.5b").num_params() < 1.8e9
    assert 7e9 < get_preset("llama-8b").num_params() < 9e9
    assert get_preset("tiny", vocab_size=300).vocab_size == 300
    assert Llama(CFG).cfg.num_params() == sum(p.numel() for p in Llama(CFG).parameters())


@pytest.mark.parametrize(
    "data, message",
    [
        ({"preset": "huge"}, "unknown model preset"),
        ({"d_model": 30, "n_heads": 4}, "multiple of n_heads"),
        ({"n_heads": 4, "n_kv_heads": 3}, "multiple of n_kv_heads"),
        ({"colour": 1}, "unknown key"),
        ({"n_layers": "12"}, "integer"),
        ({"n_layers": 0}, "positive"),
    ],
)
def test_bad_model_configs(data, message):
    with pytest.raises(UserError, match=message):
        model_config_from_dict(data)


def test_shapes():
    x = torch.randint(0, CFG.vocab_size, (3, 10))
    s0 = build_stage(CFG, [0, 1], first=True)
    s1 = build_stage(CFG, [2, 3], first=False)
    h = s0(x)
    assert h.shape == (3, 10, CFG.d_model)
    assert s1(h).shape == h.shape
    assert s0.logits(h).shape == (3, 10, CFG.vocab_size)
    assert Llama(CFG)(x).shape == (3, 10, CFG.vocab_size)
    assert s0.loss(h, x).ndim == 0
    with pytest.raises(RuntimeError, match="only stage 0"):
        s1.logits(h)
    with pytest.raises(ValueError, match="longer than the model context"):
        s1(torch.zeros(1, CFG.ctx + 1, CFG.d_model))


def test_causal_masking():
    model = Llama(CFG).eval()
    x = torch.randint(0, CFG.vocab_size, (2, 16))
    y = x.clone()
    y[:, 9] = (y[:, 9] + 1) % CFG.vocab_size
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.equal(a[:, :9], b[:, :9])  # earlier positions never see a later token
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_grouped_query_attention_matches_repeated_heads():
    """GQA with 2 kv heads = full multi-head attention whose k/v heads are repeated."""
    gqa = Llama(CFG).eval()
    mha_cfg = ModelConfig(**{**CFG.to_dict(), "n_kv_heads": CFG.n_heads})
    mha = Llama(mha_cfg).eval()
    state = gqa.state_dict()
    rep = CFG.n_heads // CFG.n_kv_heads
    for k, v in state.items():
        if k.endswith(("k_proj.weight", "v_proj.weight")):
            state[k] = v.view(CFG.n_kv_heads, CFG.head_dim, -1).repeat_interleave(rep, dim=0).reshape(CFG.d_model, -1)
    mha.load_state_dict(state)
    x = torch.randint(0, CFG.vocab_size, (2, 12))
    with torch.no_grad():
        assert torch.allclose(gqa(x), mha(x), atol=1e-6)


def test_deterministic_init_per_layer():
    a = build_stage(CFG, [2, 3], first=False).state_dict()
    b = build_stage(CFG, [3, 2], first=False).state_dict()  # order of ids does not matter
    full = Llama(CFG).state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]) and torch.equal(a[k], full[k])
    other = Llama(ModelConfig(**{**CFG.to_dict(), "seed": 4})).state_dict()
    assert not torch.equal(other["layers.2.mlp.up_proj.weight"], full["layers.2.mlp.up_proj.weight"])


@pytest.mark.parametrize("split", [[[0, 1, 2, 3, 4, 5]], [[0], [1, 2], [3, 4, 5]], [[0, 1], [2, 3], [4], [5]]])
def test_stages_compose_to_the_whole_model(split):
    model = Llama(CFG).eval()
    stages = [build_stage(CFG, ls, first=(i == 0)) for i, ls in enumerate(split)]
    x = torch.randint(0, CFG.vocab_size, (2, 20))
    with torch.no_grad():
        h = stages[0](x)
        for s in stages[1:]:
            h = s(h)
        assert torch.allclose(stages[0].logits(h), model(x), atol=1e-6)
        # leaving a stage out and swapping two = running the whole model's layers in that order
        if len(split) >= 4:
            h = stages[2](stages[0](x))
            h = stages[1](h)
            h = stages[3](h)
            order = split[0] + split[2] + split[1] + split[3]
            assert torch.allclose(stages[0].logits(h), model(x, order), atol=1e-6)
            assert not torch.allclose(model(x, order), model(x), atol=1e-4)


def test_stage_state_dict_slices():
    model = Llama(CFG)
    s = model.stage_state_dict([1, 2], first=False)
    assert set(s) == set(build_stage(CFG, [1, 2], first=False).state_dict())
    s0 = model.stage_state_dict([0], first=True)
    assert {"embed_tokens.weight", "norm.weight", "lm_head.weight"} <= set(s0)
