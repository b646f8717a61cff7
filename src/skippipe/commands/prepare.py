"""``skippipe prepare INPUT... --out DIR``: tokenize text files, folders of them or JSON Lines
into token shards with an index, once; ``skippipe train`` then reads them memory-mapped
(``[train] data = "DIR"``)."""

from __future__ import annotations

import argparse

from skippipe.commands.arguments import fraction, int_in
from skippipe.limits import MAX_VOCAB


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="text files, folders of them, JSON Lines files (.jsonl) or .json files of records; .gz too")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (new or empty; with --force: replaces a dataset)")
    p.add_argument("--tokenizer", default="bpe",
                   help="'bpe' (train a byte-level BPE here, default), 'bytes', 'gpt2', or a tokenizer.json path")
    p.add_argument("--vocab-size", type=int_in(1, MAX_VOCAB), default=4096,
                   help="with --tokenizer bpe: vocabulary size (default 4096)")
    p.add_argument("--val-fraction", type=fraction, default=0.05, help="share of documents for validation (default 0.05)")
    p.add_argument("--split", choices=["document", "tail"], default="document",
                   help="'document' (default): whole documents go to validation; 'tail': the end of every document")
    p.add_argument("--text-field", default="text", help="the field of JSON Lines records that holds the text (default: text)")
    p.add_argument("--shard-tokens", type=int_in(1), default=None, help="tokens per shard file (default 134,217,728)")
    p.add_argument("--force", action="store_true", help="replace a dataset already in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from skippipe.data.prepare import prepare_dataset
    from skippipe.data.shards import DEFAULT_SHARD_TOKENS
    from skippipe.errors import UserError

    if args.tokenizer == "bpe" and args.vocab_size <= 256:
        raise UserError(f"--vocab-size must be more than 256 for a BPE, got {args.vocab_size}")
    summary = prepare_dataset(
        args.inputs, args.out, tokenizer=args.tokenizer, vocab_size=args.vocab_size, val_fraction=args.val_fraction,
        split=args.split, text_field=args.text_field, shard_tokens=args.shard_tokens or DEFAULT_SHARD_TOKENS,
        force=args.force, progress=not args.no_progress,
    )
    print(summary.format())
    print(f"train on it: skippipe train --data {summary.out}   (or [train] data = \"{summary.out}\" in a run config)")
    return 0
