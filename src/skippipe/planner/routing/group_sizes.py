"""Groups of one site cut to whole chains (``decompose.decomposed_plan``).

A large site is split into groups of about ``decompose.GROUP_NODES`` nodes wherever the
merging of ``decompose.locality_groups`` happens to stop, and the data nodes are dealt to the
groups in proportion to their speed. With even compute a group plans best as private chains,
a data node and L - 1 others each (``groups.private_chain_sets``); a group of n nodes whose
share of data nodes is more than n / L leaves one without a chain, and the merged plan is as
slow as that group. The gcp-2025 preset with 5 clusters of 200 nodes at 1,000 nodes (S = 9,
L = 5) split each cluster into groups of 92 and 108 nodes with 18 and 22 data nodes: the
92-node groups planned at 49.94 s, the 108-node ones (21 chains, a data node left over) at
57.43-58.33 s, and the `skippipe-no-tc2` plan (56.71 s) won.

``chain_sized_groups`` cuts the groups of one site again, consecutively over their nodes in
order, into sizes that are whole multiples of L but for one (the site's remainder), as even as
that allows; where a cut would leave a group under ``least`` nodes, or the site's nodes differ
in speed (the data nodes' shares then follow the speeds, not the sizes), the groups stay.
"""

from __future__ import annotations

import numpy as np


def _one_site(transfer_s: np.ndarray, nodes: list[int], tight: float, cheapest: float) -> bool:
    sub = transfer_s[np.ix_(nodes, nodes)]
    off = ~np.eye(len(nodes), dtype=bool)
    return bool(sub[off].max() <= tight * cheapest) if len(nodes) > 1 else True


def site_bundles(transfer_s: np.ndarray, groups: list[list[int]], tight: float) -> list[list[int]]:
    """Indices of ``groups`` bundled by site: a group joins the first bundle whose nodes and
    its own are one site (no hop dearer than ``tight`` x the cluster's cheapest)."""
    off = ~np.eye(transfer_s.shape[0], dtype=bool)
    cheapest = float(transfer_s[off].min())
    bundles: list[list[int]] = []
    members: list[list[int]] = []
    for i, group in enumerate(groups):
        for bundle, nodes in zip(bundles, members):
            if _one_site(transfer_s, nodes + group, tight, cheapest):
                bundle.append(i)
                nodes.extend(group)
                break
        else:
            bundles.append([i])
            members.append(list(group))
    return bundles


def chain_sized_groups(
    transfer_s: np.ndarray, forward_s: np.ndarray, groups: list[list[int]], chain: int, least: int, tight: float,
) -> list[list[int]]:
    """``groups`` with those of each site cut again into multiples of ``chain`` nodes (see the
    module text); the order of the groups is kept."""
    out = [list(g) for g in groups]
    for bundle in site_bundles(transfer_s, groups, tight):
        if len(bundle) < 2:
            continue
        nodes = [x for i in bundle for x in groups[i]]
        if np.ptp(np.asarray(forward_s, dtype=float)[nodes]) > 1e-12:
            continue
        k = len(bundle)
        whole = len(nodes) // chain
        sizes = [chain * (whole // k + (1 if j < whole % k else 0)) for j in range(k)]
        sizes[-1] += len(nodes) - sum(sizes)
        if min(sizes) < least or sorted(sizes) == sorted(len(groups[i]) for i in bundle):
            continue
        start = 0
        for i, size in zip(bundle, sizes):
            out[i] = sorted(nodes[start:start + size])
            start += size
    return out
