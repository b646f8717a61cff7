"""Offline corpora (from installed packages), tokenizers, and the samples of each microbatch."""
