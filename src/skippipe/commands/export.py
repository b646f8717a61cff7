"""``skippipe export CHECKPOINT --hf DIR``: write a Hugging Face LLaMA directory (config.json +
model.safetensors + tokenizer.json) that ``transformers.LlamaForCausalLM.from_pretrained`` loads."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="skippipe checkpoint directory")
    p.add_argument("--hf", required=True, metavar="DIR", help="output directory for the Hugging Face model")


def run(args: argparse.Namespace) -> int:

    from skippipe.fileio import check_writable_dir
    from skippipe.model.checkpoint import load_checkpoint, load_model
    from skippipe.model.hf import export_hf

    ckpt = load_checkpoint(args.checkpoint)
    load_model(ckpt)  # checks the weights fit the config before anything is written
    out = check_writable_dir(args.hf, "export folder")
    export_hf(out, ckpt.model, ckpt.state_dict, ckpt.tokenizer_file)
    n = sum(t.numel() for t in ckpt.state_dict.values())
    print(f"exported {ckpt.path} (step {ckpt.step}, {n / 1e6:.2f} M parameters) to {out}: config.json, model.safetensors"
          + (", tokenizer.json" if ckpt.tokenizer_file else ""))
    return 0
