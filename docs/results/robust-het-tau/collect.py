"""Build docs/results/robust-het-tau/{runs.csv, results.json, tables.md, tau.png}.

Reads every run under runs/robust-tau/ (each run folder's config.yaml and summary.json) and the
full grid's 2-label-shard numbers from docs/results/robust-het-full.json (validation seed 0: the
mean and every no-bucket cclip configuration; test seeds 0..2: the chosen configurations and
the clean mean). Accuracy = final_global_acc, as in the reproduction.

.venv/bin/python docs/results/robust-het-tau/collect.py     (from the repository root)
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
RUNS = ROOT / "runs" / "robust-tau"
GRID_JSON = ROOT / "docs" / "results" / "robust-het-full.json"
S = {"fedavg": 0.4, "hierfavg": 0.3}  # the level's S: FedAvg's cloud, HierFAVG's edges
S_CLOUD = {"fedavg": 0.4, "hierfavg": 0.13}
ATTACKS = ("none", "sign_flip", "alie", "ipm")
CLEAN_SLACK, ATTACK_SLACK = 0.02, 0.03
LABEL = {"fedavg": "FedAvg", "hierfavg": "HierFAVG"}


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1; 0 for one value), as the reproduction's."""
    n = len(values)
    m = sum(values) / n
    return m, (math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0)


def key_of(alg: str, rule: str, scale: float | None, momentum: float, iters: int) -> tuple:
    return (alg, rule, None if scale is None else round(scale, 4), float(momentum), iters)


def label(k: tuple) -> str:
    alg, rule, scale, momentum, iters = k
    if rule == "mean":
        out = "mean" + (f" β={momentum:g}" if momentum else "")
    else:
        out = f"cclip τ={scale:g}S" + (f" β={momentum:g}" if momentum else "")
        out += f" L={iters}" if iters != 3 else ""
        out += " @both" if alg == "hierfavg" else ""
    return out


def new_runs() -> list[dict]:
    rows = []
    for summary in sorted(RUNS.rglob("summary.json")):
        folder = summary.parent
        rel = folder.relative_to(RUNS)
        cfg = yaml.safe_load((folder / "config.yaml").read_text())
        s = json.loads(summary.read_text())
        alg = cfg["algorithm"]["name"]
        cloud, edge = cfg["robust"]["cloud"], cfg["robust"].get("edge", {})
        rule = cloud["name"]
        scale = None
        if rule == "cclip":
            scale = (edge["tau"] if alg == "hierfavg" else cloud["tau"]) / S[alg]
            assert abs(cloud["tau"] / S_CLOUD[alg] - scale) < 1e-6, folder  # same scale at both
            assert alg == "fedavg" or edge["name"] == "cclip"
        rows.append(
            {
                "source": "check" if rel.parts[0] == "check" else "new",
                "algorithm": alg,
                "split": cfg["eval_split"],
                "seed": cfg["seed"],
                "rule": rule,
                "tau_scale": None if scale is None else round(scale, 4),
                "tau_cloud": cloud.get("tau"),
                "tau_edge": edge.get("tau") if alg == "hierfavg" else None,
                "momentum": float(cfg["algorithm"].get("client_momentum", 0.0)),
                "clip_iters": cloud.get("clip_iters", 3) if rule == "cclip" else None,
                "attack": cfg["faults"]["attack"]["name"],
                "acc": s.get("final_global_acc", math.nan),
                "stopped": bool(s.get("stopped")),
                "seconds": round(float(s.get("seconds", 0.0)), 3),
                "folder": str(rel),
            }
        )
    return rows


def grid_runs() -> list[dict]:
    data = json.loads(GRID_JSON.read_text())
    rows = []
    for r in data["results"]:
        c = r["config"]
        if r["partition"] != "shards2" or c["bucket"] != 1 or c["rule"] not in ("mean", "cclip"):
            continue
        if r["algorithm"] == "hierfavg" and c["rule"] == "cclip" and c["placement"] != "both":
            continue
        if c["rule"] == "mean" and c["momentum"]:
            continue
        alg = r["algorithm"]
        scale = c["tau_scale"]
        for seed, acc in enumerate(r["accs"]):
            rows.append(
                {
                    "source": "grid",
                    "algorithm": alg,
                    "split": r["split"],
                    "seed": seed,
                    "rule": c["rule"],
                    "tau_scale": scale,
                    "tau_cloud": None if scale is None else round(scale * S_CLOUD[alg], 6),
                    "tau_edge": round(scale * S[alg], 6) if scale and alg == "hierfavg" else None,
                    "momentum": float(c["momentum"]),
                    "clip_iters": 3 if c["rule"] == "cclip" else None,
                    "attack": r["attack"],
                    "acc": acc,
                    "stopped": bool(r["stopped"]),
                    "seconds": None,
                    "folder": "robust-heterogeneity-mnist-full (docs/results/robust-het-full.json)",
                }
            )
    return rows


def table(rows: list[dict], split: str, seeds: set[int] | None = None) -> dict:
    """(config key) -> attack -> list of (seed, acc); a run that stopped counts as 0."""
    out: dict = {}
    for r in rows:
        if r["split"] != split or r["source"] == "check" or (seeds and r["seed"] not in seeds):
            continue
        k = key_of(r["algorithm"], r["rule"], r["tau_scale"], r["momentum"], r["clip_iters"] or 3)
        acc = 0.0 if r["stopped"] else r["acc"]
        out.setdefault(k, {}).setdefault(r["attack"], {})[r["seed"]] = acc
    return out


def pct(x: float) -> str:
    return f"{100 * x:.2f}"


def pm(vals: list[float]) -> str:
    m, s = mean_std(vals)
    return f"{100 * m:.2f} ± {100 * s:.2f}" if len(vals) > 1 else pct(m)


def main() -> None:
    rows = grid_runs() + new_runs()
    sources: dict = {}
    for r in rows:
        if r["source"] == "check":
            continue
        k = key_of(r["algorithm"], r["rule"], r["tau_scale"], r["momentum"], r["clip_iters"] or 3)
        sources.setdefault((r["split"], k, r["seed"]), set()).add(r["source"])
    fields = list(rows[0])
    with open(HERE / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "acc": f"{r['acc']:.6f}"})

    md: list[str] = []
    out: dict = {"selection": {}, "val_seeds": {}, "test": {}, "check": []}

    # the reproduction check: the full grid's chosen FedAvg configuration rerun
    grid_val = table(rows, "val", {0})
    for r in rows:
        if r["source"] == "check":
            k = key_of("fedavg", "cclip", r["tau_scale"], r["momentum"], r["clip_iters"])
            old = grid_val[k][r["attack"]][0]
            out["check"].append({"attack": r["attack"], "new": r["acc"], "grid": old})

    val0 = table(rows, "val", {0})
    for alg in ("fedavg", "hierfavg"):
        ref = key_of(alg, "mean", None, 0.0, 3)
        clean_mean = val0[ref]["none"][0]
        ranking = []
        for k, cells in val0.items():
            if k[0] != alg or set(cells) != set(ATTACKS):
                continue
            accs = {a: cells[a][0] for a in ATTACKS}
            worst = min(accs[a] for a in ATTACKS[1:])
            ranking.append(
                {
                    "config": label(k),
                    "key": k,
                    "source": "+".join(sorted(sources[("val", k, 0)])),
                    **accs,
                    "worst": worst,
                    "eligible": accs["none"] >= clean_mean - CLEAN_SLACK - 1e-9,
                }
            )
        ranking.sort(key=lambda r: (not r["eligible"], -r["worst"], -r["none"]))
        chosen = ranking[0]
        c = json.loads(GRID_JSON.read_text())["chosen"][alg]
        old_key = key_of(alg, c["rule"], c["tau_scale"], c["momentum"], 3)
        old = next(r for r in ranking if r["key"] == old_key)
        out["selection"][alg] = {
            "clean_mean": clean_mean,
            "chosen": chosen["config"],
            "grid_chosen": old["config"],
            "rows": [{**r, "key": list(r["key"])} for r in ranking],
        }
        md += [
            f"## {LABEL[alg]}: validation, seed 0 (the selection)",
            "",
            f"Clean mean's attack-free validation accuracy {pct(clean_mean)} %; eligible: "
            f"attack-free ≥ {pct(clean_mean - CLEAN_SLACK)} %. Sorted by τ; source: grid = the "
            "full grid's run, new = this study's. Best worst case among the eligible: "
            f"**{chosen['config']}** ({pct(chosen['worst'])} %; the full grid chose "
            f"{old['config']}, {pct(old['worst'])} %).",
            "",
            "| configuration | source | attack-free | Δ clean mean | sign flip | ALIE | IPM | "
            "worst case | eligible | rank |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        order = sorted(
            ranking,
            key=lambda r: (r["key"][1] != "mean", r["key"][2] or 0, r["key"][4], r["key"][3]),
        )
        for r in order:
            rank = ranking.index(r) + 1
            bold = "**" if r is chosen else ""
            md.append(
                f"| {bold}{r['config']}{bold} | {r['source']} | {pct(r['none'])} | "
                f"{100 * (r['none'] - clean_mean):+.2f} | {pct(r['sign_flip'])} | "
                f"{pct(r['alie'])} | {pct(r['ipm'])} | {bold}{pct(r['worst'])}{bold} | "
                f"{'yes' if r['eligible'] else 'no'} | {rank} |"
            )
        md.append("")

    # the validation curve over seeds 0..2 (extra: not used for the choice)
    val = table(rows, "val")
    for alg in ("fedavg", "hierfavg"):
        ref = key_of(alg, "mean", None, 0.0, 3)
        ref_seeds = sorted(val[ref]["none"])
        if len(ref_seeds) < 3:
            continue
        cm, cs = mean_std([val[ref]["none"][s] for s in ref_seeds])
        curve = []
        for k, cells in sorted(val.items(), key=lambda kv: (kv[0][2] or 0, kv[0][3])):
            if k[0] != alg or k[1] != "cclip" or k[4] != 3 or set(cells) != set(ATTACKS):
                continue
            seeds = set.intersection(*(set(cells[a]) for a in ATTACKS))
            if len(seeds) < 3:
                continue
            seeds = sorted(seeds)
            per = {a: [cells[a][s] for s in seeds] for a in ATTACKS}
            means = {a: mean_std(per[a]) for a in ATTACKS}
            worst_attack = min(ATTACKS[1:], key=lambda a: means[a][0])
            per_seed_worst = [min(cells[a][s] for a in ATTACKS[1:]) for s in seeds]
            curve.append(
                {
                    "config": label(k),
                    "tau_scale": k[2],
                    "momentum": k[3],
                    "seeds": seeds,
                    **{
                        a: {"mean": means[a][0], "std": means[a][1], "accs": per[a]}
                        for a in ATTACKS
                    },
                    "worst_attack": worst_attack,
                    "worst": means[worst_attack][0],
                    "per_seed_worst": per_seed_worst,
                }
            )
        out["val_seeds"][alg] = {"clean_mean": {"mean": cm, "std": cs}, "rows": curve}
        md += [
            f"## {LABEL[alg]}: validation, seeds 0, 1, 2 (extra; not used for the choice)",
            "",
            f"Mean ± std over the 3 validation seeds (each seed its own partition and validation "
            f"set). Clean mean attack-free: {pm([val[ref]['none'][s] for s in ref_seeds])} %. "
            "Worst case: the lowest of the three attacks' means"
            + (
                " (the sign flip's in every row, and on every seed the sign flip is that seed's "
                "worst attack)."
                if all(c["per_seed_worst"] == c["sign_flip"]["accs"] for c in curve)
                else "."
            ),
            "",
            "| configuration | attack-free | Δ clean mean | sign flip | ALIE | IPM | worst case | "
            "worst Δ clean mean |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for c in curve:
            md.append(
                f"| {c['config']} | {pm(c['none']['accs'])} | "
                f"{100 * (c['none']['mean'] - cm):+.2f} | {pm(c['sign_flip']['accs'])} | "
                f"{pm(c['alie']['accs'])} | {pm(c['ipm']['accs'])} | {pct(c['worst'])} | "
                f"{100 * (c['worst'] - cm):+.2f} |"
            )
        md.append("")

    # the test runs: the clean mean, the full grid's choice, this study's choice (if new)
    test = table(rows, "test")
    for alg in ("fedavg", "hierfavg"):
        ref = key_of(alg, "mean", None, 0.0, 3)
        clean = mean_std(list(test[ref]["none"].values()))[0]
        sel = out["selection"][alg]
        keys = [
            tuple(r["key"])
            for r in sel["rows"]
            if r["config"] in (sel["chosen"], sel["grid_chosen"])
        ]
        lines = []
        for k in dict.fromkeys([*keys, ref]):
            if k not in test or set(test[k]) != set(ATTACKS):
                continue
            cells = {a: [test[k][a][s] for s in sorted(test[k][a])] for a in ATTACKS}
            means = {a: mean_std(cells[a])[0] for a in ATTACKS}
            gaps = {a: means[a] - clean for a in ATTACKS}
            worst = min(gaps[a] for a in ATTACKS[1:])
            holds = worst >= -ATTACK_SLACK - 1e-9 and gaps["none"] >= -CLEAN_SLACK - 1e-9
            role = (
                "clean mean"
                if k == ref
                else ("chosen here" if label(k) == sel["chosen"] else "")
                + (" + " if label(k) == sel["chosen"] == sel["grid_chosen"] else "")
                + ("full grid's choice" if label(k) == sel["grid_chosen"] else "")
            )
            out["test"].setdefault(alg, []).append(
                {
                    "config": label(k),
                    "role": role,
                    "source": "+".join(
                        sorted(set.union(*(sources[("test", k, s)] for s in test[k]["none"])))
                    ),
                    "accs": cells,
                    "gaps": gaps,
                    "worst_gap": worst,
                    "holds": holds if k != ref else None,
                }
            )
            lines.append(
                f"| {LABEL[alg]} | {label(k)} | {role} | "
                + " | ".join(pm(cells[a]) for a in ATTACKS)
                + f" | {100 * worst:+.2f} | {100 * gaps['none']:+.2f} | "
                + ("—" if k == ref else ("**yes**" if holds else "**no**"))
                + " |"
            )
        out["test"].setdefault(alg, [])
        if alg == "fedavg":
            md += [
                "## Test, seeds 0, 1, 2 (the must-show)",
                "",
                "Mean ± std over seeds; Δ to the clean mean's attack-free test mean.",
                "",
                "| algorithm | configuration | role | attack-free | sign flip | ALIE | IPM | "
                "worst Δ | attack-free Δ | within 3 / 2 points |",
                "|---|---|---|---|---|---|---|---|---|---|",
            ]
        md += lines
    md.append("")

    (HERE / "results.json").write_text(json.dumps(out, indent=1, default=list) + "\n")
    (HERE / "tables.md").write_text(
        "# A finer τ for cclip (issue 41): tables\n\nWritten by collect.py from runs.csv.\n\n"
        + "\n".join(md)
    )
    figure(out)
    compact = compact_tables(out)
    (HERE / "compact.md").write_text(compact)
    print("\n".join(md))
    print(compact)


def compact_tables(out: dict) -> str:
    """FedAvg and HierFAVG side by side per (τ, β): attack-free and worst case (validation seed 0;
    seeds 0–2), the tables of docs/robustness.md."""
    md = []
    sel = {a: {tuple(r["key"])[2:]: r for r in out["selection"][a]["rows"]} for a in LABEL}
    worst_is_sf = all(
        r["worst"] == r["sign_flip"] for a in LABEL for r in out["selection"][a]["rows"]
    )
    keys = sorted(
        {k for a in LABEL for k in sel[a] if k[0] is not None},
        key=lambda k: (k[0], k[2], k[1]),
    )
    chosen = {a: out["selection"][a]["chosen"] for a in LABEL}
    md += [
        "Validation, seed 0 (the selection; worst case = "
        + ("the sign flip in every row" if worst_is_sf else "the lowest attack")
        + "; clean mean "
        + " / ".join(f"{LABEL[a]} {pct(out['selection'][a]['clean_mean'])}" for a in LABEL)
        + " %):",
        "",
        "| τ / S | β | L | FedAvg attack-free | FedAvg worst case | HierFAVG attack-free "
        "| HierFAVG worst case |",
        "|---|---|---|---|---|---|---|",
    ]
    for k in keys:
        cells = []
        for a in LABEL:
            r = sel[a].get(k)
            if r is None:
                cells += ["", ""]
                continue
            mark = "**" if r["config"] == chosen[a] else ""
            src = "" if r["source"] == "new" else " (grid)"
            cells += [f"{pct(r['none'])}{src}", f"{mark}{pct(r['worst'])}{mark}"]
        md.append(f"| {k[0]:g} | {k[1]:g} | {k[2]} | " + " | ".join(cells) + " |")
    md += [
        "",
        "Validation, seeds 0–2, mean ± std (extra; clean mean "
        + " / ".join(
            f"{LABEL[a]} {100 * out['val_seeds'][a]['clean_mean']['mean']:.2f} ± "
            f"{100 * out['val_seeds'][a]['clean_mean']['std']:.2f}"
            for a in LABEL
        )
        + " %):",
        "",
        "| τ / S | β | FedAvg attack-free | FedAvg sign flip | HierFAVG attack-free "
        "| HierFAVG sign flip |",
        "|---|---|---|---|---|---|",
    ]
    curve = {
        a: {(r["tau_scale"], r["momentum"]): r for r in out["val_seeds"][a]["rows"]} for a in LABEL
    }
    for k in sorted(set(curve["fedavg"]) | set(curve["hierfavg"])):
        cells = []
        for a in LABEL:
            r = curve[a].get(k)
            cells += [pm(r["none"]["accs"]), pm(r["sign_flip"]["accs"])] if r else ["", ""]
        md.append(f"| {k[0]:g} | {k[1]:g} | " + " | ".join(cells) + " |")
    return "\n".join(md) + "\n"


def figure(out: dict) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, alg in zip(axes, ("fedavg", "hierfavg"), strict=True):
        data = out["val_seeds"].get(alg)
        if not data:
            continue
        cm = data["clean_mean"]["mean"]
        for momentum, style in ((0.0, "-"), (0.9, "--")):
            rows = [r for r in data["rows"] if r["momentum"] == momentum]
            x = [r["tau_scale"] for r in rows]
            for what, color in (("none", "tab:blue"), ("sign_flip", "tab:red")):
                name = "attack-free" if what == "none" else "sign flip 20 %"
                y = [100 * r[what]["mean"] for r in rows]
                e = [100 * r[what]["std"] for r in rows]
                ax.errorbar(
                    x,
                    y,
                    yerr=e,
                    fmt=style + "o",
                    color=color,
                    ms=3,
                    capsize=2,
                    label=f"{name}, β={momentum:g}",
                )
        ax.axhline(100 * cm, color="k", lw=0.8, label="clean mean, attack-free")
        ax.axhline(100 * (cm - ATTACK_SLACK), color="k", lw=0.8, ls=":", label="clean mean − 3")
        ax.set_xscale("log")
        ax.set_xticks([0.25, 0.5, 0.75, 1, 1.5, 2, 2.5])
        ax.set_xticklabels(["0.25", "0.5", "0.75", "1", "1.5", "2", "2.5"])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("cclip τ / S")
        ax.set_title(f"{LABEL[alg]} (validation, seeds 0–2)")
        ax.set_ylim(70, 92)
    axes[0].set_ylabel("accuracy (%)")
    axes[0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(HERE / "tau.png", dpi=120)


if __name__ == "__main__":
    main()
