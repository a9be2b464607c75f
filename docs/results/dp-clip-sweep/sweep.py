"""DP-FedAvg clip-norm sweep of docs/robustness.md ("Why S = 0.5"), seed 0, on the test set.

Every run is the `fedhp reproduce dp` FedAvg run (same overrides, `base_overrides`), with the
rounds T, the clip norm S and σ calibrated for the target ε over those T rounds (`noise_for`);
ε = ∞ is the reproduction's σ = 0, S = ∞ run. Usage, from the repository root:

    OMP_NUM_THREADS=1 .venv/bin/python docs/results/dp-clip-sweep/sweep.py OUT [RESULT_DIR]

Runs go to OUT/T<T>-eps<ε>-S<S>/ (a finished run is reused); the table to
RESULT_DIR/dp-clip-sweep.{json,md} (default: OUT).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from fedhp.experiments.common import ReproOptions, run_config
from fedhp.experiments.dp import base_overrides, noise_for

# (T, target ε, S); ε = ∞ means no noise and no clipping.
GRID = [
    (200, 8.0, 0.25),
    (200, 8.0, 0.5),
    (200, 8.0, 1.0),
    (200, 8.0, 2.0),
    (200, math.inf, math.inf),
    (200, 1.0, 0.25),
    (200, 1.0, 0.5),
    (400, 8.0, 0.25),
    (400, 8.0, 0.5),
    (400, math.inf, math.inf),
    (400, 1.0, 0.25),
]


def main() -> None:
    out = Path(sys.argv[1])
    result_dir = Path(sys.argv[2]) if len(sys.argv) > 2 else out
    rows = []
    for rounds, eps, clip in GRID:
        opts = ReproOptions(rounds=rounds, rounds_given=True, model="dnn")
        overrides = base_overrides(opts, "fedavg", 0)
        sigma = 0.0
        if not math.isinf(eps):
            sigma = noise_for(overrides, eps)
            overrides = [
                *overrides,
                f"privacy.noise_multiplier={sigma!r}",
                f"privacy.clip_norm={clip}",
            ]
        folder = out / f"T{rounds}-eps{eps:g}-S{clip:g}"
        summary = run_config(overrides, folder)
        row = {
            "rounds": rounds,
            "target_epsilon": None if math.isinf(eps) else eps,
            "epsilon": summary.get("privacy", {}).get("epsilon"),
            "noise_multiplier": sigma,
            "clip_norm": None if math.isinf(clip) else clip,
            "final_global_acc": summary["final_global_acc"],
            "best_global_acc": summary["best_global_acc"],
            "seconds": summary["seconds"],
            "overrides": overrides,
        }
        rows.append(row)
        print(
            f"T={rounds} eps={eps:g} S={clip:g} sigma={sigma:.4f}",
            f"acc={row['final_global_acc']:.4f}",
            flush=True,
        )
    result_dir.mkdir(parents=True, exist_ok=True)
    (result_dir / "dp-clip-sweep.json").write_text(
        json.dumps({"seed": 0, "rows": rows}, indent=1) + "\n"
    )
    lines = [
        "| T | target ε | σ | S | final acc (%) | best acc (%) | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        eps = "∞" if r["target_epsilon"] is None else f"{r['target_epsilon']:g}"
        clip = "∞" if r["clip_norm"] is None else f"{r['clip_norm']:g}"
        lines.append(
            f"| {r['rounds']} | {eps} | {r['noise_multiplier']:.4f} | {clip} | "
            f"{100 * r['final_global_acc']:.2f} | {100 * r['best_global_acc']:.2f} | "
            f"{r['seconds']:.0f} |"
        )
    head = (
        "DP-FedAvg clip-norm sweep, MNIST 1,000 clients (2 shards of 30), DNN 784-100-10, "
        "q = 0.1, 6 steps of batch 10 at lr 0.1, δ = 1e-5 (RDP), seed 0, "
        "accuracy on the 10,000 test images. "
        "`OMP_NUM_THREADS=1 .venv/bin/python docs/results/dp-clip-sweep/sweep.py OUT`.\n\n"
    )
    (result_dir / "dp-clip-sweep.md").write_text(head + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
