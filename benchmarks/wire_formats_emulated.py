"""Less on the wire, measured: the real runtime on 20 emulated nodes with activations and
gradients sent in fp32, bf16 and int8 (per-row scales).

For each format the ``skippipe`` planner plans the 20-node network ``gcp-2025/geo-distributed/20``
(latency and bandwidth per link, so the bytes per hop matter) with that format's bytes per value,
and 20 worker processes run the plan with WAN emulation (every message delayed by its planned
transfer time, every operation stretched to its modelled time, times ``--time-scale``), sending
tensors in that format. Printed per format: the simulated iteration time, the measured one (plan
seconds, mean over iterations after the first) and the ratio to fp32's.

    python3 benchmarks/wire_formats_emulated.py [--time-scale 0.04] [--iterations 4] [--out DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runtime_emulated import emulation_args, run_method

from skippipe.fileio import atomic_write_text

FORMATS = ("fp32", "bf16", "int8")


def main() -> int:
    args, out = emulation_args(__doc__.splitlines()[0], "skippipe-wire-")
    results = {}
    for fmt in FORMATS:
        r = run_method("skippipe", out / fmt, args.time_scale, args.iterations, "gcp-2025/geo-distributed/20", fmt)
        results[fmt] = r
        print(f"{fmt:5s} simulated {r['simulated_s']:7.2f} s   measured {r['measured_s']:7.2f} s "
              f"({100 * (r['measured_s'] / r['simulated_s'] - 1):+5.1f} %)   per iteration "
              f"{[round(x, 1) for x in r['per_iteration_s']]}", flush=True)
    base = results["fp32"]
    print("\n| wire format | simulated s / iteration | measured s / iteration | measured vs fp32 |")
    print("|---|---|---|---|")
    for fmt, r in results.items():
        print(f"| {fmt} | {r['simulated_s']:.2f} | {r['measured_s']:.2f} | {r['measured_s'] / base['measured_s']:.3f} |")
    atomic_write_text(out / "results.json", json.dumps(results, indent=1) + "\n")
    print(f"(runs kept in {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
