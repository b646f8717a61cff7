"""Training FLOPs of a LLaMA expert: what the configurations' budgets are matched in.

Per token, a forward pass costs 2 FLOPs per weight of every matrix it multiplies by (the
attention projections, the SwiGLU MLP and the LM head; the embedding is a lookup), plus the
attention scores and their weighted sum, 2 x seq_len x d_model per layer (Kaplan et al. 2020,
"Scaling laws", table 1; no causal halving). Training is forward + backward = 3 x forward.
Norms, rotary embeddings, softmax and the optimizer are left out: they are O(parameters) or
O(seq_len) per token and change nothing in the comparison.

The cost is affine in the MLP width and in the depth, so an S + L pair that moves the same
amount of width (or depth) each way costs exactly 2 x M: the paper's 0.75 / 1 / 1.25 ladder.
"""

from __future__ import annotations

from skippipe.model.config import ModelConfig


def matmul_params(cfg: ModelConfig) -> int:
    """Weights a token is multiplied by: every layer's projections and MLP, and the LM head."""
    d, kv = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * cfg.ffn_dim  # q, o; k, v; gate, up, down
    return cfg.n_layers * per_layer + d * cfg.vocab_size


def forward_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    return 2 * matmul_params(cfg) + 2 * cfg.n_layers * seq_len * cfg.d_model


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    return 3 * forward_flops_per_token(cfg, seq_len)


def train_flops_per_step(cfg: ModelConfig, batch_size: int, seq_len: int) -> int:
    return batch_size * seq_len * train_flops_per_token(cfg, seq_len)


def train_flops(cfg: ModelConfig, steps: int, batch_size: int, seq_len: int) -> int:
    """FLOPs of ``steps`` optimizer steps of ``batch_size`` windows of ``seq_len`` tokens."""
    return steps * train_flops_per_step(cfg, batch_size, seq_len)


def format_flops(flops: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if flops >= scale:
            return f"{flops / scale:.3f} {unit}"
    return f"{flops:.3g} FLOP"
