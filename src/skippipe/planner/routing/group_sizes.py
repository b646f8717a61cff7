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

On a site of alike nodes the merging ties everywhere, and where it ends in one group (one site
of 263, 400 or 700 nodes, but 69-node groups at 230, 300 or 1,000) the cluster was planned
whole: 263 nodes (S = 9, L = 5) at 58.88 s in 31-33 s. So a site that is one group of at
least four times ``least`` nodes is cut into groups of about twice ``least`` the same way
(263 nodes: 130 and 133, 57.43 s in 7.4 s).
"""

from __future__ import annotations

import numpy as np


def cheapest_hop(transfer_s: np.ndarray) -> float:
    """The cluster's cheapest hop between two distinct nodes."""
    return float(transfer_s[~np.eye(transfer_s.shape[0], dtype=bool)].min())


def one_site(transfer_s: np.ndarray, nodes: list[int], tight: float, cheapest: float) -> bool:
    """Whether ``nodes`` are one site: no hop among them dearer than ``tight`` x ``cheapest``."""
    if len(nodes) < 2:
        return True
    sub = transfer_s[np.ix_(nodes, nodes)]
    return bool(sub[~np.eye(len(nodes), dtype=bool)].max() <= tight * cheapest)


def site_bundles(transfer_s: np.ndarray, groups: list[list[int]], tight: float) -> list[list[int]]:
    """Indices of ``groups`` bundled by site: a group joins the first bundle whose nodes and
    its own are one site (``one_site``)."""
    cheapest = cheapest_hop(transfer_s)
    bundles: list[list[int]] = []
    members: list[list[int]] = []
    for i, group in enumerate(groups):
        for bundle, nodes in zip(bundles, members):
            if one_site(transfer_s, nodes + group, tight, cheapest):
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
    """``groups`` with those of each site cut again into multiples of ``chain`` nodes, and a
    site that is one group of ``4 * least`` nodes or more cut into groups of about
    ``2 * least`` (see the module text); the order of the groups is kept."""
    out = [[list(g)] for g in groups]  # per group of ``groups``: what takes its place
    for bundle in site_bundles(transfer_s, groups, tight):
        nodes = [x for i in bundle for x in groups[i]]
        k = len(bundle) if len(bundle) > 1 else len(nodes) // (2 * least)
        if k < 2 or np.ptp(np.asarray(forward_s, dtype=float)[nodes]) > 1e-12:
            continue
        whole = len(nodes) // chain
        sizes = [chain * (whole // k + (1 if j < whole % k else 0)) for j in range(k)]
        sizes[-1] += len(nodes) - sum(sizes)
        if min(sizes) < least or sorted(sizes) == sorted(len(groups[i]) for i in bundle):
            continue
        starts = np.cumsum([0, *sizes])
        cut = [sorted(nodes[a:b]) for a, b in zip(starts[:-1], starts[1:])]
        if len(bundle) > 1:
            for i, group in zip(bundle, cut):
                out[i] = [group]
        else:
            out[bundle[0]] = cut
    return [g for parts in out for g in parts]
