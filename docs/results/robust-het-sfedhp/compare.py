"""compare.md: sFedHP's hierarchy stage beside FedAvg's flat rule and HierFAVG's stage on the
same clients (2 label shards), from the two table.json files:

    python3 docs/results/robust-het-sfedhp/compare.py docs/results/robust-het-full.json \\
        docs/results/robust-het-sfedhp/table.json > docs/results/robust-het-sfedhp/compare.md
"""

import json
import sys
from pathlib import Path
from typing import Any

TRIVIAL = 0.1135
ATTACKS = ["none", "sign_flip", "alie", "ipm"]
LABELS = {"fedavg": "FedAvg", "hierfavg": "HierFAVG", "sfedhp": "sFedHP"}
MEAN = {"rule": "mean", "tau_scale": None, "bucket": 1, "momentum": 0.0, "placement": ""}
Key = tuple[Any, ...]


def index(data: dict[str, Any], split: str) -> dict[Key, dict[str, Any]]:
    out = {}
    for r in data["results"]:
        if r["split"] == split and r["partition"] == "shards2":
            c = r["config"]
            key = (c["rule"], c["tau_scale"], c["bucket"], c["momentum"], c["placement"])
            out[(r["algorithm"], *key, r["attack"])] = r
    return out


def pct(x: float) -> str:
    return f"{100 * x:.2f}" + (" ▼" if x <= TRIVIAL + 1e-12 else "")


def val_cell(val: dict[Key, dict[str, Any]], alg: str, *config: Any) -> str:
    """Worst case over the attacks (a stopped run counts 0), attack-free in brackets."""
    rows = [val.get((alg, *config, a)) for a in ATTACKS]
    if any(r is None for r in rows):
        return "—"
    worst = min(0.0 if r["stopped"] else r["acc"] for r in rows[1:] if r is not None)
    assert rows[0] is not None
    return f"{pct(worst)} ({100 * rows[0]['acc']:.2f})"


def main() -> None:
    full, sf = (json.loads(Path(path).read_text()) for path in sys.argv[1:3])
    val = {**index(full, "val"), **index(sf, "val")}
    test = {**index(full, "test"), **index(sf, "test")}
    places = ("edge", "cloud", "both")
    lines = [
        "# sFedHP's hierarchy stage beside FedAvg's flat rule and HierFAVG's stage "
        "(issue 41, deliverable 3)",
        "",
        "The same clients (MNIST, 100 clients × 2 label shards, 10 edges of 10, MLR, 50 rounds, "
        "20 % spread attackers), from docs/results/robust-het-full.json (FedAvg, HierFAVG; "
        "2026-11-27 12:37–13:51 UTC) and docs/results/robust-het-sfedhp/table.json (sFedHP; "
        "2026-11-27 15:29–15:47 UTC), by `compare.py` in this folder. ▼: at or below the trivial "
        "baseline 11.35 %. One validation seed: differences under ~1.5 points are ties.",
        "",
        "### Validation (2 label shards, seed 0): worst case over sign flip, ALIE and IPM at "
        "20 % (attack-free in brackets), %",
        "",
        "| rule | s | FedAvg (flat: at its cloud) | "
        + " | ".join(f"{LABELS[a]} @{p}" for a in ("hierfavg", "sfedhp") for p in places)
        + " |",
        "|---|---|---|" + "---|" * 6,
    ]
    mean = tuple(MEAN.values())
    cells = [val_cell(val, "fedavg", *mean)]
    cells += [val_cell(val, a, *mean) for a in ("hierfavg", "sfedhp") for _ in places]
    lines.append("| mean | 1 | " + " | ".join(cells) + " |")
    for rule, tau in (("cclip", 1.0), ("geomed", None)):
        for bucket in (1, 2):
            name = rule if tau is None else f"{rule} τ={tau:g}S"
            cells = [val_cell(val, "fedavg", rule, tau, bucket, 0.0, "")]
            cells += [
                val_cell(val, a, rule, tau, bucket, 0.0, p)
                for a in ("hierfavg", "sfedhp")
                for p in places
            ]
            lines.append(f"| {name} | {bucket} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "(No client momentum in any of these rows, sFedHP having none; FedAvg's and HierFAVG's "
        "rows with β = 0.9 are in robust-het-full.md. The mean's cell repeats across a method's "
        "three columns.)",
        "",
        "### Test (2 label shards, mean ± std over seeds 0..2): the configuration each algorithm "
        "chose on validation, and its mean",
        "",
        "| algorithm | configuration | attack-free | sign flip | ALIE | IPM | worst |",
        "|---|---|---|---|---|---|---|",
    ]
    for data, algs in ((full, ["fedavg", "hierfavg"]), (sf, ["sfedhp"])):
        for alg in algs:
            chosen = data["chosen"][alg]
            pairs = [(chosen, " (chosen)")]
            if chosen["label"] != "mean":
                pairs.append(({**MEAN, "label": "mean"}, ""))
            for c, tag in pairs:
                key = (c["rule"], c["tau_scale"], c["bucket"], c["momentum"], c["placement"])
                rows = [test[(alg, *key, a)] for a in ATTACKS]
                accs = [
                    f"{100 * r['acc']:.2f} ± {100 * r['std']:.2f}"
                    + (" ▼" if r["acc"] <= TRIVIAL + 1e-12 else "")
                    for r in rows
                ]
                worst = pct(min(r["acc"] for r in rows[1:]))
                lines.append(
                    f"| {LABELS[alg]} | {c['label']}{tag} | " + " | ".join(accs) + f" | {worst} |"
                )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
