"""A LLaMA-style decoder (nanoGPT-sized): RMSNorm, rotary embeddings, SwiGLU, grouped-query
attention through ``scaled_dot_product_attention``, split into pipeline stages.

- ``Stage``: the part of the model one node holds. Stage 0 (the data nodes) holds the token
  embedding, its own layers, the final norm and the LM head; every other stage holds its layers.
- ``Llama``: the whole model, used by eval and export; it can run its layers in any order and
  leave some out.

Parameter names follow Hugging Face's ``LlamaForCausalLM`` without the ``model.`` prefix
(``embed_tokens.weight``, ``layers.7.mlp.up_proj.weight``, ``norm.weight``, ``lm_head.weight``),
so a stage's ``state_dict`` is a slice of the full model's and export is a rename.

Initialisation is deterministic per layer id: layer ``i`` draws its weights from a generator
seeded by ``(config.seed, i)``, so every node's copy of a stage, and the unsplit model, start
with identical weights no matter how the layers are grouped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from skippipe.model.config import ModelConfig

EMBED_SEED_ID = -1
HEAD_SEED_ID = -2


def _generator(cfg: ModelConfig, part: int) -> torch.Generator:
    return torch.Generator().manual_seed(cfg.seed * 1_000_003 + part + 7)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary_tables(cfg: ModelConfig, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (length, head_dim), in Hugging Face's half-split layout."""
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim))
    t = torch.arange(length, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.n_kv != self.n_heads:  # query head h reads key/value head h // (n_heads / n_kv)
            rep = self.n_heads // self.n_kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """One decoder layer: pre-norm attention and pre-norm SwiGLU, both residual."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


@torch.no_grad()
def init_block(block: Block, cfg: ModelConfig, layer_id: int) -> None:
    """Deterministic init of layer ``layer_id``: normal(0, std) weights, residual projections
    scaled by 1/sqrt(2 n_layers) (GPT-2), norms at one."""
    g = _generator(cfg, layer_id)
    out_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
    for name, p in block.named_parameters():  # fixed registration order
        if p.ndim == 1:
            p.fill_(1.0)
        else:
            std = out_std if name.endswith(("o_proj.weight", "down_proj.weight")) else cfg.init_std
            p.copy_(torch.randn(p.shape, generator=g) * std)


class _LayerHost(nn.Module):
    """Holds blocks keyed by their global layer id and the rotary tables."""

    def __init__(self, cfg: ModelConfig, layer_ids: Iterable[int]):
        super().__init__()
        self.cfg = cfg
        ids = [int(i) for i in layer_ids]
        for i in ids:
            if not 0 <= i < cfg.n_layers:
                raise ValueError(f"layer id {i} outside 0..{cfg.n_layers - 1}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"layer ids {ids} repeat")
        self.layer_ids = ids
        self.checkpointing = False  # recompute each layer in the backward (``torch.utils.checkpoint``)
        self.layers = nn.ModuleDict()
        for i in ids:
            with torch.device("meta"):  # no throw-away default init, global RNG untouched
                block = Block(cfg)
            block = block.to_empty(device="cpu")
            init_block(block, cfg, i)
            self.layers[str(i)] = block
        cos, sin = rotary_tables(cfg, cfg.ctx)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def run_layers(self, h: torch.Tensor, order: Sequence[int] | None = None) -> torch.Tensor:
        T = h.shape[1]
        if T > self.cfg.ctx:
            raise ValueError(f"sequence of {T} tokens is longer than the model context {self.cfg.ctx}")
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        recompute = self.checkpointing and torch.is_grad_enabled()
        for i in self.layer_ids if order is None else order:
            block = self.layers[str(i)]
            h = torch.utils.checkpoint.checkpoint(block, h, cos, sin, use_reentrant=False) if recompute else block(h, cos, sin)
        return h


def _make_embed_head(host: nn.Module, cfg: ModelConfig) -> None:
    with torch.device("meta"):
        embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
    host.embed_tokens = embed.to_empty(device="cpu")
    host.lm_head = head.to_empty(device="cpu")
    host.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
    with torch.no_grad():
        embed = torch.randn(host.embed_tokens.weight.shape, generator=_generator(cfg, EMBED_SEED_ID))
        host.embed_tokens.weight.copy_(embed * cfg.init_std)
        host.lm_head.weight.copy_(torch.randn(host.lm_head.weight.shape, generator=_generator(cfg, HEAD_SEED_ID)) * cfg.init_std)


class Stage(_LayerHost):
    """The layers of one pipeline stage; stage 0 (``first=True``) also embeds and predicts.

    Operations (see ``skippipe.train.ops`` for the autograd-aware wrappers the executors use):

    - ``forward(x)``: on stage 0 ``x`` is token ids (B, T) and the result is embedding + its
      layers; on other stages ``x`` is hidden states (B, T, d_model) and so is the result.
    - ``loss(h, targets)`` (stage 0 only): final norm + LM head + mean cross-entropy.
    """

    def __init__(self, cfg: ModelConfig, layer_ids: Iterable[int], first: bool):
        super().__init__(cfg, layer_ids)
        self.first = first
        if first:
            _make_embed_head(self, cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.embed_tokens(x)
        return self.run_layers(x)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        if not self.first:
            raise RuntimeError("only stage 0 holds the LM head")
        return self.lm_head(self.norm(h))

    def loss(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.logits(h)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def build_stage(cfg: ModelConfig, layer_ids: Iterable[int], first: bool, checkpointing: bool = False) -> Stage:
    """A node's copy of a stage, deterministically initialised (identical on every node);
    ``checkpointing``: keep only each layer's input and recompute the layer in the backward."""
    stage = Stage(cfg, layer_ids, first)
    stage.checkpointing = checkpointing
    return stage


class Llama(_LayerHost):
    """The whole model. ``forward(tokens, order)`` runs the layers in ``order`` (default: all,
    ascending); leaving ids out of ``order`` omits those layers."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, range(cfg.n_layers))
        _make_embed_head(self, cfg)

    def forward(self, tokens: torch.Tensor, order: Sequence[int] | None = None) -> torch.Tensor:
        h = self.run_layers(self.embed_tokens(tokens), order)
        return self.lm_head(self.norm(h))

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor, order: Sequence[int] | None = None) -> torch.Tensor:
        logits = self.forward(tokens, order)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    def stage_state_dict(self, layer_ids: Iterable[int], first: bool) -> dict[str, torch.Tensor]:
        """The slice of this model's weights a ``Stage`` with these layers holds."""
        ids = {str(i) for i in layer_ids}
        out = {}
        for name, t in self.state_dict().items():
            part = name.split(".")
            if part[0] == "layers":
                if part[1] in ids:
                    out[name] = t
            elif first:
                out[name] = t
        return out
