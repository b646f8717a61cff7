"""``skippipe eval CHECKPOINT``: validation perplexity of a checkpoint (or, with ``--hf``, of a
Hugging Face LLaMA directory), optionally with pipeline stages omitted."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from skippipe.errors import UserError


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated stage numbers, got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="checkpoint directory (config.json + model.safetensors or stage-*.safetensors)")
    p.add_argument("--hf", action="store_true", help="the directory is a Hugging Face LLaMA model")
    p.add_argument("--omit", type=_int_list, default=[], metavar="S,S", help="stages to leave out (not 0), e.g. 2,3")
    p.add_argument("--sweep", action="store_true", help="every number of omitted stages, averaged over choices")
    p.add_argument("--max-choices", type=int, default=20, help="with --sweep: at most this many choices per count")
    p.add_argument(
        "--stages", type=int, default=None, help="split the layers into this many equal stages (default: the checkpoint's)"
    )
    p.add_argument("--samples", type=int, default=64, help="validation windows (default 64)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per window (default: the training length)")
    p.add_argument("--corpus", default=None, help="comma-separated corpora (default: the training corpora)")
    p.add_argument("--tokenizer", default=None, help="tokenizer JSON file, or 'bytes' (default: the checkpoint's)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)
    from skippipe.data.dataset import validation_tokens
    from skippipe.data.tokenizers_hf import load_tokenizer_file
    from skippipe.eval import layer_order, omission_sweep, validation_loss
    from skippipe.model.checkpoint import load_checkpoint, load_model
    from skippipe.model.hf import load_hf_model

    path = Path(args.checkpoint)
    train: dict = {}
    tok_file = None
    if args.hf:
        model = load_hf_model(path)
        stage_layers = [list(range(model.cfg.n_layers))]
        if (path / "tokenizer.json").is_file():
            tok_file = path / "tokenizer.json"
    else:
        ckpt = load_checkpoint(path)
        model = load_model(ckpt)
        stage_layers = ckpt.stage_layers
        train = ckpt.train or {}
        tok_file = "bytes" if ckpt.tokenizer_kind == "bytes" else ckpt.tokenizer_file
    if args.tokenizer:
        tok_file = args.tokenizer
    if tok_file is None:
        raise UserError(f"{path}: no tokenizer saved with the model; give --tokenizer FILE or --tokenizer bytes")
    tok = load_tokenizer_file(tok_file)
    if tok.vocab_size > model.cfg.vocab_size:
        raise UserError(f"tokenizer has {tok.vocab_size} tokens but the model only {model.cfg.vocab_size}")
    if args.stages is not None:
        n, k = model.cfg.n_layers, args.stages
        if not 1 <= k <= n:
            raise UserError(f"--stages must be between 1 and the number of layers ({n})")
        stage_layers = [list(range(n * i // k, n * (i + 1) // k)) for i in range(k)]
    corpus = args.corpus.split(",") if args.corpus else train.get("corpus", ["shakespeare", "bible"])
    val = validation_tokens(tok, corpus, float(train.get("val_fraction", 0.05)))
    seq_len = args.seq_len or int(train.get("seq_len") or 0) or model.cfg.ctx
    if seq_len > model.cfg.ctx:
        raise UserError(f"--seq-len {seq_len} is longer than the model context {model.cfg.ctx}")
    if args.samples < 1:
        raise UserError("--samples must be at least 1")

    if args.sweep:
        if args.omit:
            raise UserError("give either --omit or --sweep, not both")
        rows = omission_sweep(model, val, stage_layers, seq_len, args.samples, max_choices=args.max_choices, progress=True)
        base = rows[0].mean_ppl
        if args.json:
            rows_json = [{"omitted": r.omitted, "choices": r.choices, "losses": r.losses, "mean_ppl": r.mean_ppl} for r in rows]
            print(json.dumps(rows_json))
            return 0
        print(f"{path}: {len(stage_layers)} stages {stage_layers}, {args.samples} windows x {seq_len} tokens")
        print("omitted  choices  mean loss  mean ppl  vs full")
        for r in rows:
            print(f"{r.omitted:7d}  {len(r.choices):7d}  {r.mean_loss:9.4f}  {r.mean_ppl:8.2f}  {r.mean_ppl / base:7.3f}")
        return 0

    order = layer_order(stage_layers, args.omit)
    loss = validation_loss(model, val, seq_len, args.samples, 8, order)
    if args.json:
        print(json.dumps({"omit": args.omit, "layers": order, "loss": loss, "perplexity": math.exp(loss)}))
    else:
        kept = f"omitting stage(s) {args.omit}" if args.omit else "full model"
        print(f"{path}: {kept}, {len(order)} of {model.cfg.n_layers} layers, {args.samples} windows x {seq_len} tokens")
        print(f"validation loss {loss:.4f}  perplexity {math.exp(loss):.2f}")
    return 0
