"""From measurements to a cluster file: a latency + bytes / bandwidth fit per link, the file
``skippipe plan`` reads, and the error of the fit against an emulated cluster. Torch-free.

All times written are *cluster seconds*: measured seconds divided by the emulation's time scale
(1 without emulation), so a profile under emulation is comparable with the emulated cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import nnls

from skippipe.cluster import Cluster, cluster_from_dict
from skippipe.costs import activation_bytes

MAX_BANDWIDTH_GBPS = 1e4  # written when a link shows no size dependence at all (faster than measurable)
GIB = 1024.0**3


def fit_link(sizes: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """(latency s, bandwidth GiB/s) of ``seconds = latency + sizes / bandwidth``, least squares
    with both terms >= 0. At least two distinct sizes."""
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(seconds, dtype=float)
    if x.shape != y.shape or len(np.unique(x)) < 2:
        raise ValueError("fit_link needs one time per size and at least two distinct sizes")
    scale = float(x.max())
    coef, _ = nnls(np.column_stack([np.ones_like(x), x / scale]), y)
    latency, per_byte = float(coef[0]), float(coef[1]) / scale
    bandwidth = MAX_BANDWIDTH_GBPS if per_byte <= 0 else min(MAX_BANDWIDTH_GBPS, 1.0 / (per_byte * GIB))
    return latency, bandwidth


def link_matrices(one_way_s: np.ndarray, sizes: list[int], time_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Latency (ms) and bandwidth (GiB/s) matrices from one-way times ``[N, N, len(sizes)]``
    (measured seconds). Both triangles are fitted; a pair measured one way only is mirrored."""
    t = np.asarray(one_way_s, dtype=float) / time_scale
    n = t.shape[0]
    lat = np.zeros((n, n))
    bw = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            row = t[i, j] if np.any(t[i, j] > 0) else t[j, i]
            latency, bandwidth = fit_link(np.asarray(sizes), row)
            lat[i, j], bw[i, j] = latency * 1000.0, bandwidth
    np.fill_diagonal(bw, bw.max() if n > 1 else MAX_BANDWIDTH_GBPS)
    return lat, bw


@dataclass
class Measured:
    """Everything the workers measured, gathered on rank 0 (times in measured seconds)."""

    sizes: list[int]
    one_way_s: np.ndarray  # [N, N, K]
    forward_s: np.ndarray  # [N] one stage, one microbatch
    backward_s: np.ndarray  # [N]
    usable_bytes: np.ndarray  # [N] memory the node may fill
    activation_bytes: np.ndarray  # [N] activations one microbatch keeps for its backward
    state_bytes: np.ndarray  # [N] weights, gradients and Adam moments of a stage (+ embedding and head)


def memory_slots(m: Measured, max_slots: int) -> np.ndarray:
    """Activation slots per node: what is left after the stage's state, in microbatches, 1..max."""
    left = m.usable_bytes - m.state_bytes
    with np.errstate(divide="ignore", invalid="ignore"):
        slots = np.floor(left / np.maximum(m.activation_bytes, 1.0))
    return np.clip(np.nan_to_num(slots, nan=1.0), 1, max_slots).astype(int)


def cluster_document(
    m: Measured, *, name: str, d_model: int, ctx: int, samples: int, layers: int, time_scale: float,
    links: str, max_slots: int, info: dict[str, Any],
) -> dict[str, Any]:
    """The cluster file: ``transfer_s`` (or ``latency_ms`` + ``bandwidth_GBps``), ``forward_s``,
    ``memory``, and a ``profile`` block with the raw figures."""
    lat, bw = link_matrices(m.one_way_s, m.sizes, time_scale)
    nbytes = activation_bytes(d_model, ctx, samples)
    doc: dict[str, Any] = {"name": name, "description": f"measured by skippipe profile ({info.get('emulate') or 'no emulation'})"}
    if links == "transfer":
        transfer = lat / 1000.0 + nbytes / (bw * GIB)
        np.fill_diagonal(transfer, 0.0)
        doc["transfer_s"] = _round(transfer)
    else:
        doc["latency_ms"] = _round(lat)
        doc["bandwidth_GBps"] = _round(bw)
    doc["forward_s"] = _round(m.forward_s / time_scale)
    doc["memory"] = memory_slots(m, max_slots).tolist()
    doc["profile"] = {
        **info,
        "time_scale": time_scale,
        "model": {"d_model": d_model, "ctx": ctx, "layers_per_stage": layers, "samples": samples},
        "activation_message_bytes": nbytes,
        "sizes_bytes": list(m.sizes),
        "latency_ms": _round(lat),
        "bandwidth_GBps": _round(bw),
        "backward_s": _round(m.backward_s / time_scale),
        "backward_factor": _round(m.backward_s / np.maximum(m.forward_s, 1e-12)),
        "usable_bytes": m.usable_bytes.astype(int).tolist(),
        "activation_bytes": m.activation_bytes.astype(int).tolist(),
        "state_bytes": m.state_bytes.astype(int).tolist(),
    }
    return doc


def _round(a: np.ndarray) -> Any:
    return np.vectorize(lambda x: float(f"{x:.6g}"))(np.asarray(a, dtype=float)).tolist()


@dataclass
class LinkError:
    """Relative errors of measured links against a reference (emulated) cluster, per pair i < j."""

    pairs: list[tuple[int, int]]
    latency: list[float]
    bandwidth: list[float]
    transfer: list[float]  # of one microbatch's activations: latency + bytes / bandwidth

    @staticmethod
    def _stat(values: list[float], fn: Any) -> float:
        return float(fn(np.abs(values))) if values else math.nan

    def summary(self) -> dict[str, float]:
        return {
            "latency_median": self._stat(self.latency, np.median), "latency_max": self._stat(self.latency, np.max),
            "bandwidth_median": self._stat(self.bandwidth, np.median), "bandwidth_max": self._stat(self.bandwidth, np.max),
            "transfer_median": self._stat(self.transfer, np.median), "transfer_max": self._stat(self.transfer, np.max),
        }


def link_errors(measured: Cluster, reference_lat: np.ndarray, reference_bw: np.ndarray, nbytes: int) -> LinkError:
    """Compare a profile's cluster (with latency/bandwidth in its ``profile`` block or as matrices)
    with the emulated latency (ms) and bandwidth (GiB/s) matrices."""
    assert measured.latency_ms is not None and measured.bandwidth_GBps is not None
    lat, bw = measured.latency_ms, measured.bandwidth_GBps
    out = LinkError([], [], [], [])
    for i in range(measured.n):
        for j in range(i + 1, measured.n):
            t_ref = reference_lat[i, j] / 1000.0 + nbytes / (reference_bw[i, j] * GIB)
            t_got = lat[i, j] / 1000.0 + nbytes / (bw[i, j] * GIB)
            out.pairs.append((i, j))
            out.latency.append(float(lat[i, j] / reference_lat[i, j] - 1.0))
            out.bandwidth.append(float(bw[i, j] / reference_bw[i, j] - 1.0))
            out.transfer.append(float(t_got / t_ref - 1.0))
    return out


def links_of(doc: dict[str, Any]) -> Cluster:
    """The profile's links as a latency/bandwidth cluster (whatever format the file was written in)."""
    prof = doc["profile"]
    data = {"name": doc.get("name", "profile"), "latency_ms": prof["latency_ms"], "bandwidth_GBps": prof["bandwidth_GBps"]}
    return cluster_from_dict(data)
