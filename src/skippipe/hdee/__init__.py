"""HDEE: Heterogeneous Domain Expert Ensembles (Ersoy et al., arXiv 2502.19385).

Small LLaMA experts, each trained alone on one text domain (optionally branched from a seed
model trained on the mixture, as in Branch-Train-Merge), with model sizes and step counts
chosen per domain from its difficulty under one FLOPs budget, combined at inference as a
posterior-weighted mixture of their next-token distributions.

One job per module:

- ``config``: the typed, validated ``skippipe hdee`` config (TOML).
- ``domains``: offline text sources and the deterministic by-document train/val/test split.
- ``data``: tokenizer and per-domain token arrays (cached in the run folder), training batches.
- ``flops``: training FLOPs per token, per step and per expert.
- ``difficulty``: manual levels, or scores measured with the seed model or short probe runs.
- ``budget``: configurations (homogeneous, step-, size-, both-heterogeneous) under one budget.
- ``checkpoint``: atomic expert checkpoints with a manifest.
- ``train``: one resumable training job; ``jobs``: many of them in parallel processes.
- ``pipeline``: the phases of ``skippipe hdee train`` (data, seeds, difficulty, plan, experts).
- ``mixture``: the posterior-weighted mixture, in log space.
- ``evaluate``: per-domain perplexities of every configuration; ``report``: tables and chart.
- ``generate``: sampling text from the mixture.
"""
