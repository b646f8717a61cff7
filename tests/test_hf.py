"""Hugging Face interop (transformers loads our export, we load theirs), checkpoints, and the
``skippipe eval`` / ``skippipe export`` commands."""

import json
import math

import numpy as np
import pytest
import torch

from skippipe.cli import main
from skippipe.data.tokenizer import train_bpe
from skippipe.errors import UserError
from skippipe.model.checkpoint import load_checkpoint, load_model, save_checkpoint, save_stage_shard, write_checkpoint_meta
from skippipe.model.config import ModelConfig
from skippipe.model.hf import export_hf, import_hf, load_hf_model
from skippipe.model.llama import Llama, build_stage

transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)

CFG = ModelConfig(vocab_size=120, d_model=48, n_layers=4, n_heads=6, n_kv_heads=2, ffn_dim=80, ctx=32,
                  rope_theta=5000.0, norm_eps=1e-6, seed=5)


def trained_like(cfg: ModelConfig) -> Llama:
    """Weights away from their init (norm gains too), so a wrong name or layout shows."""
    model = Llama(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def test_export_loads_in_transformers_with_matching_logits(tmp_path):
    model = trained_like(CFG)
    export_hf(tmp_path / "hf", CFG, model.state_dict())
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.num_key_value_heads == 2 and hf.config.hidden_size == 48
    x = torch.randint(0, CFG.vocab_size, (2, 20))
    with torch.no_grad():
        ours, theirs = model(x), hf(x).logits
    assert (ours - theirs).abs().max().item() < 1e-4


def test_import_a_transformers_model(tmp_path):
    hf_cfg = transformers.LlamaConfig(
        vocab_size=90, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=24, rms_norm_eps=1e-5, rope_theta=20000.0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    hf.save_pretrained(tmp_path / "theirs")
    cfg, state = import_hf(tmp_path / "theirs")
    assert (cfg.n_layers, cfg.n_kv_heads, cfg.rope_theta, cfg.ctx) == (3, 1, 20000.0, 24)
    ours = load_hf_model(tmp_path / "theirs")
    x = torch.randint(0, 90, (2, 24))
    with torch.no_grad():
        assert (ours(x) - hf(x).logits).abs().max().item() < 1e-4
    # and back out again: the round trip keeps every tensor
    export_hf(tmp_path / "again", cfg, state)
    _, state2 = import_hf(tmp_path / "again")
    assert all(torch.equal(state[k], state2[k]) for k in state)


def test_import_errors(tmp_path):
    with pytest.raises(UserError, match="no config.json"):
        import_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(UserError, match="only 'llama'"):
        import_hf(tmp_path)


def _val_tokenizer():
    return train_bpe(["In the beginning God created the heaven and the earth.\n" * 5, "To be, or not to be\n"] * 3, 300)


def test_checkpoint_layouts_agree(tmp_path):
    """model.safetensors (reference executor) and stage shards (distributed run) load the same model."""
    model = trained_like(CFG)
    layers = [[0], [1, 2], [3]]
    tok = _val_tokenizer()
    save_checkpoint(tmp_path / "single", CFG, model.state_dict(), 7, layers, tokenizer=tok)
    for s, ls in enumerate(layers):
        stage = build_stage(CFG, ls, first=(s == 0))
        stage.load_state_dict(model.stage_state_dict(ls, first=(s == 0)))
        save_stage_shard(tmp_path / "sharded", s, stage)
    write_checkpoint_meta(tmp_path / "sharded", CFG, 7, layers, tokenizer=tok)
    a, b = load_checkpoint(tmp_path / "single"), load_checkpoint(tmp_path / "sharded")
    assert a.step == b.step == 7 and a.stage_layers == layers and a.tokenizer_kind == "bpe"
    assert set(a.state_dict) == set(b.state_dict)
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    x = torch.randint(0, CFG.vocab_size, (1, 10))
    with torch.no_grad():
        assert torch.equal(load_model(a)(x), model(x))
    (tmp_path / "sharded" / "stage-1.safetensors").unlink()
    with pytest.raises(UserError, match="stage-1"):
        load_checkpoint(tmp_path / "sharded")
    with pytest.raises(UserError, match="not a checkpoint"):
        load_checkpoint(tmp_path / "nowhere")


@pytest.fixture
def checkpoint(tmp_path):
    tok = _val_tokenizer()
    cfg = ModelConfig(**{**CFG.to_dict(), "vocab_size": tok.vocab_size})
    model = trained_like(cfg)
    path = tmp_path / "ckpt"
    save_checkpoint(path, cfg, model.state_dict(), 3, [[0], [1], [2], [3]],
                    train={"corpus": ["bible"], "seq_len": 16, "val_fraction": 0.05}, tokenizer=tok)
    return path, model


def test_eval_command(checkpoint, capsys):
    path, model = checkpoint
    assert main(["eval", str(path), "--samples", "4", "--json"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert full["layers"] == [0, 1, 2, 3] and math.isclose(full["perplexity"], math.exp(full["loss"]))
    assert main(["eval", str(path), "--samples", "4", "--omit", "1,3", "--json"]) == 0
    omitted = json.loads(capsys.readouterr().out)
    assert omitted["layers"] == [0, 2] and omitted["loss"] != full["loss"]
    assert main(["eval", str(path), "--samples", "4", "--sweep", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [len(r["choices"]) for r in rows] == [1, 3, 3, 1]  # omit 0..3 of the 3 non-data stages
    assert rows[0]["losses"][0] == pytest.approx(full["loss"])
    assert main(["eval", str(path), "--samples", "4", "--omit", "0"]) == 2
    assert "stage 0" in capsys.readouterr().err
    assert main(["eval", str(path), "--omit", "9"]) == 2


def test_export_command(checkpoint, tmp_path, capsys):
    path, model = checkpoint
    assert main(["export", str(path), "--hf", str(tmp_path / "hf")]) == 0
    assert "exported" in capsys.readouterr().out
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    x = torch.from_numpy(np.arange(12).reshape(1, 12) % model.cfg.vocab_size)
    with torch.no_grad():
        assert (hf(x).logits - model(x)).abs().max().item() < 1e-4
    # the exported directory evaluates like the checkpoint
    assert main(["eval", str(tmp_path / "hf"), "--hf", "--samples", "4", "--seq-len", "16", "--corpus", "bible", "--json"]) == 0
    via_hf = json.loads(capsys.readouterr().out)
    assert main(["eval", str(path), "--samples", "4", "--json"]) == 0
    assert via_hf["loss"] == pytest.approx(json.loads(capsys.readouterr().out)["loss"], abs=1e-5)
    assert main(["export", str(tmp_path / "missing"), "--hf", str(tmp_path / "x")]) == 2


def test_export_sets_end_of_text_and_tokenizer_config(checkpoint, tmp_path):
    path, model = checkpoint
    assert main(["export", str(path), "--hf", str(tmp_path / "hf")]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf")
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    assert hf.config.eos_token_id == eot == tok.eos_token_id and hf.config.pad_token_id == eot == tok.pad_token_id
    assert tok.decode(tok("In the beginning")["input_ids"]) == "In the beginning"
