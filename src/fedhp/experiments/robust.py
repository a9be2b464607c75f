"""``robust``: Byzantine-robust aggregation under attack (issue 20; ``docs/robustness.md``).

FedAvg and HierFAVG on MNIST (or Fashion-MNIST): 100 clients with 2 label-sorted shards each,
10 edges of 10 clients, uniform weighting, every client in every round; 10 local SGD steps per
round (HierFAVG: κ1 = 5 steps per edge round, κ2 = 2 edge rounds per cloud round), batch 20,
lr 0.05, MLR by default (``--model dnn``: 784-100-10), 50 rounds (``--quick``: 10 rounds, sign
flip and ALIE at 20 % only). Each attack of :data:`ATTACKS` with 10 / 20 / 30 % malicious clients
(0 % run once per algorithm and aggregator), one row per aggregator: the rule at the cloud
(FedAvg), at both levels (HierFAVG, ``<rule>``) or at the edges only with the cloud's mean
(HierFAVG, ``<rule>-edge``); HierFAVG's rows also run sign flip 20 % with the attackers
concentrated on the first edges (attack ``sign_flip-concentrated``). An IID control
(algorithm ``fedavg-iid``: the same runs with IID labels, ``partition.name=quantity`` with
β = 1000) runs FedAvg's rows attack-free and under sign flip 20 %.

The rules' parameters are fixed per level, not tuned to the attack (:data:`LEVELS`): trimmed
mean β = 0.3 (so 30 % attackers can all be trimmed at the cloud), Krum's f the most attackers a
level may see (FedAvg's cloud 30 of 100, 3 of 10 rows at HierFAVG's edges and cloud), clip's S
about the median norm of the benign updates in the attack-free run (0.4 for FedAvg's clients,
0.3 for HierFAVG's clients at an edge, 0.13 for its edges at the cloud; MLR). Sign flip uses
``s = 4`` (``s = 1`` does not collapse the mean here, see the docs).

Prints one line per result, ``robust <attack> <fraction> <algorithm> <aggregator>
acc=<float>`` (final global accuracy, mean over seeds; `` diverged`` appended when a run stopped
on a non-finite loss, its accuracy then the last one evaluated); writes ``table.md`` /
``table.json`` and ``sign_flip-<algorithm>.png`` (accuracy vs attacker fraction per aggregator).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError
from fedhp.experiments.common import (
    MODELS,
    ReproOptions,
    inputs_text,
    markdown_table,
    mean_std,
    run_keyed,
)
from fedhp.reporting import Line, plot_lines, write_json_atomic

ATTACKS = ("sign_flip", "gaussian", "boost", "label_flip", "alie")
FRACTIONS = (0.1, 0.2, 0.3)
RULES = ("mean", "median", "trimmed_mean", "krum", "multi_krum", "clip")
ALGORITHMS = ("fedavg", "hierfavg")
LABELS = {"fedavg": "FedAvg", "hierfavg": "HierFAVG"}
SIGN_SCALE = 4.0
BETA = 0.3
LEVELS: dict[tuple[str, str], tuple[int, float]] = {
    # (algorithm, level) -> (Krum's f, clip's S)
    ("fedavg", "cloud"): (30, 0.4),
    ("hierfavg", "edge"): (3, 0.3),
    ("hierfavg", "cloud"): (3, 0.13),
}
CONCENTRATED = ("sign_flip", 0.2)
"""The attack and fraction HierFAVG's rows also run with the attackers on the first edges."""
CLIENTS, EDGES, STEPS, KAPPA1, BATCH, LR = 100, 10, 10, 5, 20, 0.05


@dataclass(frozen=True)
class Case:
    """One attack setting: ``attack`` (``none``: attack-free), ``fraction``, ``placement``."""

    attack: str
    fraction: float
    placement: str = "spread"

    @property
    def label(self) -> str:
        """The attack column of the result line (``-concentrated`` for that placement)."""
        base = "none" if self.attack == "none" else self.attack
        return base if self.placement == "spread" else f"{base}-{self.placement}"

    @property
    def folder(self) -> str:
        return f"{self.label}-{self.fraction:g}"

    def overrides(self) -> list[str]:
        if self.attack == "none":
            return []
        return [
            f"faults.attack.name={self.attack}",
            f"faults.attack.fraction={self.fraction}",
            f"faults.attack.placement={self.placement}",
            f"faults.attack.sign_scale={SIGN_SCALE}",
        ]


@dataclass(frozen=True)
class Row:
    """One aggregator row of an algorithm: ``rule`` at the cloud and/or the edges."""

    algorithm: str
    rule: str
    edge_only: bool = False
    iid: bool = False  # the IID control: labels IID over clients (quantity partition)

    @property
    def label(self) -> str:
        return f"{self.rule}-edge" if self.edge_only else self.rule

    @property
    def name(self) -> str:
        """The algorithm column of the result line (``-iid`` for the IID control)."""
        return f"{self.algorithm}-iid" if self.iid else self.algorithm

    @property
    def title(self) -> str:
        return LABELS[self.algorithm] + (" (IID)" if self.iid else "")

    def partition(self) -> list[str]:
        if self.iid:  # Dirichlet sizes with β = 1000: equal sizes up to ~3 %, labels IID
            return ["partition.name=quantity", "partition.beta=1000"]
        return ["partition.name=shards", "partition.shards_per_client=2"]

    def overrides(self) -> list[str]:
        levels = ["cloud"] if self.algorithm == "fedavg" else ["edge", "cloud"]
        if self.edge_only:
            levels = ["edge"]
        out = []
        for level in levels:
            f, clip = LEVELS[(self.algorithm, level)]
            out += [f"robust.{level}.name={self.rule}"]
            if self.rule == "trimmed_mean":
                out.append(f"robust.{level}.beta={BETA}")
            elif self.rule in ("krum", "multi_krum"):
                out.append(f"robust.{level}.f={f}")
            elif self.rule == "clip":
                out.append(f"robust.{level}.clip_norm={clip}")
        return out


def rows_of(algorithm: str) -> list[Row]:
    """The aggregator rows of ``algorithm`` (HierFAVG: both levels, then edges only; FedAvg:
    then the IID control)."""
    rows = [Row(algorithm, rule) for rule in RULES]
    if algorithm == "hierfavg":
        rows += [Row(algorithm, rule, edge_only=True) for rule in RULES if rule != "mean"]
    else:
        rows += [Row(algorithm, rule, iid=True) for rule in RULES]
    return rows


def cases_of(opts: ReproOptions, algorithm: str, iid: bool = False) -> list[Case]:
    """The attack settings: attack-free, then every attack × fraction (``--quick``: sign flip
    and ALIE at 20 %), and for HierFAVG :data:`CONCENTRATED` with ``placement=concentrated``;
    the IID control: attack-free and :data:`CONCENTRATED` (spread)."""
    if iid:
        return [Case("none", 0.0), Case(*CONCENTRATED)]
    attacks, fractions = (("sign_flip", "alie"), (0.2,)) if opts.quick else (ATTACKS, FRACTIONS)
    cases = [Case("none", 0.0)] + [Case(a, f) for a in attacks for f in fractions]
    if algorithm == "hierfavg":
        cases.append(Case(*CONCENTRATED, placement="concentrated"))
    return cases


def rounds_of(opts: ReproOptions) -> int:
    return opts.rounds if opts.rounds_given else (10 if opts.quick else 50)


def algorithm_overrides(algorithm: str) -> list[str]:
    if algorithm == "fedavg":
        return ["algorithm.name=fedavg", f"algorithm.local_steps={STEPS}"]
    return [
        "algorithm.name=hierfavg",
        f"algorithm.kappa1={KAPPA1}",
        f"algorithm.kappa2={STEPS // KAPPA1}",
    ]


def run_overrides(opts: ReproOptions, row: Row, case: Case, seed: int) -> list[str]:
    """Every override of one run."""
    model = opts.model or "mlr"
    if model not in MODELS:
        raise ConfigError(f"--model: robust runs {', '.join(MODELS)}; got {model!r}")
    return [
        f"dataset.name={opts.dataset}",
        *([f"dataset.data_dir={opts.data_dir}"] if opts.data_dir else []),
        *row.partition(),
        f"federation.num_clients={CLIENTS}",
        f"federation.num_edges={EDGES}",
        "federation.weighting=uniform",
        "federation.client_fraction=1.0",
        *MODELS[model],
        f"algorithm.batch_size={BATCH}",
        f"algorithm.lr={LR}",
        *algorithm_overrides(row.algorithm),
        *row.overrides(),
        *case.overrides(),
        f"rounds={rounds_of(opts)}",
        f"eval_every={opts.eval_every}",
        "eval_train=false",
        "max_loss=null",  # an attacked run goes on while its loss is finite
        f"threads={opts.threads}",
        "progress=false",
        "checkpoint_every=25",
        f"seed={seed}",
        *opts.extra,
    ]


def pct(value: float) -> str:
    return f"{100 * value:.2f}"


def result_line(row: Row, case: Case, entry: dict[str, Any]) -> str:
    tail = " diverged" if entry["stopped"] else ""
    return (
        f"robust {case.label} {case.fraction:g} {row.name} {row.label} acc={entry['acc']:.4f}{tail}"
    )


def attack_tables(results: dict[tuple[Row, Case], dict[str, Any]], rows: list[Row]) -> str:
    """One table per attack: a row per (algorithm, aggregator), a column per fraction (%)."""
    cases = {case for _, case in results}
    attacks = [a for a in ATTACKS if any(c.attack == a for c in cases)]
    text = []
    for attack in attacks:
        fractions = sorted(
            {c.fraction for c in cases if c.attack == attack and c.placement == "spread"}
        )
        header = ["algorithm", "aggregator", "0 %", *(f"{100 * f:g} %" for f in fractions)]
        body = []
        for row in rows:
            cells = [row.title, row.label]
            for case in [Case("none", 0.0), *(Case(attack, f) for f in fractions)]:
                entry = results.get((row, case))
                cell = "—" if entry is None else pct(entry["acc"])
                cells.append(cell + (" †" if entry and entry["stopped"] else ""))
            body.append(cells)
        text.append(f"### {attack} (final global accuracy %)\n\n" + markdown_table(header, body))
    return "\n".join(text)


def sign_flip_checks(results: dict[tuple[Row, Case], dict[str, Any]], rows: list[Row]) -> str:
    """Sign flip 20 %: each row's accuracy against its own attack-free run and against the
    mean's attack-free run (the must-show checks), spread and concentrated."""
    body = []
    for row in rows:
        clean = results.get((row, Case("none", 0.0)))
        mean_clean = results.get((Row(row.algorithm, "mean", iid=row.iid), Case("none", 0.0)))
        for placement in ("spread", "concentrated"):
            hit = results.get((row, Case(*CONCENTRATED, placement=placement)))
            if hit is None or clean is None or mean_clean is None:
                continue
            body.append(
                [
                    row.title,
                    row.label,
                    placement,
                    pct(clean["acc"]),
                    pct(hit["acc"]),
                    f"{100 * (hit['acc'] - clean['acc']):+.2f}",
                    f"{100 * (hit['acc'] - mean_clean['acc']):+.2f}",
                ]
            )
    if not body:
        return ""
    header = [
        "algorithm",
        "aggregator",
        "placement",
        "attack-free %",
        "sign flip 20 % %",
        "Δ own attack-free",
        "Δ mean attack-free",
    ]
    return "### sign flip 20 %: the must-show checks\n\n" + markdown_table(header, body)


def describe(opts: ReproOptions, wall: float) -> str:
    import torch

    model = opts.model or "mlr"
    return (
        f"{opts.dataset}, {CLIENTS} clients × 2 label-sorted shards, {EDGES} edges of "
        f"{CLIENTS // EDGES}, uniform weighting, all clients every round; {rounds_of(opts)} "
        f"rounds, {STEPS} local SGD steps per round (HierFAVG κ1 = {KAPPA1}, "
        f"κ2 = {STEPS // KAPPA1}), batch {BATCH}, lr {LR}, model {model}; sign flip "
        f"s = {SIGN_SCALE:g}, gaussian σ = 1, boost "
        f"k = 10, ALIE z = Baruch's z_max; trimmed mean β = {BETA}, Krum/Multi-Krum f = 30 "
        f"(FedAvg cloud) / 3 (HierFAVG edges and cloud), Multi-Krum m = n − f, clip S = 0.4 "
        f"(FedAvg) / 0.3 (HierFAVG edges) / 0.13 (HierFAVG cloud). acc: final global accuracy "
        f"(the union of the clients' test sets), mean over seeds 0..{opts.seeds - 1}; † a run "
        f"stopped on a non-finite loss (its last evaluated accuracy). torch threads = "
        f"{opts.threads}, {opts.jobs} run(s) at once, {wall:.0f} s of runs in all (machine: "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}). "
        f"{inputs_text(opts.dataset, opts.extra)}"
    ).rstrip()


def figures(out: Path, results: dict[tuple[Row, Case], dict[str, Any]], rows: list[Row]) -> None:
    """``sign_flip-<algorithm>.png``: accuracy vs attacker fraction, a line per aggregator (a
    colour per rule; the edge-only rows the same colour with markers)."""
    colors = dict(
        zip(
            RULES,
            ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"),
            strict=True,
        )
    )
    for algorithm in sorted({r.algorithm for r in rows}):
        lines = []
        for row in (r for r in rows if r.algorithm == algorithm and not r.iid):
            points = sorted(
                (case.fraction, entry["acc"])
                for (r, case), entry in results.items()
                if r == row and case.placement == "spread" and case.attack in ("none", "sign_flip")
            )
            if len(points) > 1:
                xs, ys = [100 * f for f, _ in points], [a for _, a in points]
                marker = "o" if row.edge_only else ""
                lines.append(Line(row.label, xs, ys, color=colors[row.rule], marker=marker))
        if lines:
            plot_lines(
                lines,
                out / f"sign_flip-{algorithm}.png",
                "sign-flip attackers (% of clients)",
                "final global accuracy",
                f"{LABELS[algorithm]} under sign flip (s = {SIGN_SCALE:g})",
            )


def reproduce(opts: ReproOptions) -> dict[str, Any]:
    """Run every (algorithm, aggregator, attack setting, seed); print the result lines; write
    the tables and the figures."""
    if opts.dataset not in ("mnist", "fmnist"):
        raise ConfigError(f"--dataset: robust runs mnist or fmnist; got {opts.dataset!r}")
    algorithms = opts.chosen_methods(ALGORITHMS)
    tag = "quick" if opts.quick else "full"
    out, runs = opts.folders(f"robust-{opts.dataset}-{tag}")
    rows = [row for a in algorithms for row in rows_of(a)]
    tasks = [
        (
            (row, case, seed),
            run_overrides(opts, row, case, seed),
            runs / row.name / row.label / case.folder / f"seed{seed}",
        )
        for row in rows
        for case in cases_of(opts, row.algorithm, row.iid)
        for seed in range(opts.seeds)
    ]
    done = run_keyed(opts, tasks, lambda k: f"{k[0].name} {k[0].label} {k[1].folder} seed {k[2]}")
    wall = sum(float(summary.get("seconds", 0.0)) for summary in done.values())
    results: dict[tuple[Row, Case], dict[str, Any]] = {}
    for row in rows:
        for case in cases_of(opts, row.algorithm, row.iid):
            summaries = [done[(row, case, seed)] for seed in range(opts.seeds)]
            acc, std = mean_std([float(s["final_global_acc"]) for s in summaries])
            entry = {
                "acc": acc,
                "std": std,
                "stopped": [s["stopped"] for s in summaries if s.get("stopped")],
                "seconds": sum(float(s.get("seconds", 0.0)) for s in summaries),
            }
            results[(row, case)] = entry
            print(result_line(row, case, entry), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    figures(out, results, rows)
    description = describe(opts, wall)
    text = attack_tables(results, rows) + "\n" + sign_flip_checks(results, rows)
    result = {
        "dataset": opts.dataset,
        "quick": opts.quick,
        "seeds": opts.seeds,
        "rounds": rounds_of(opts),
        "description": description,
        "results": [
            {
                "algorithm": row.name,
                "aggregator": row.label,
                "attack": case.attack,
                "fraction": case.fraction,
                "placement": case.placement,
                **entry,
            }
            for (row, case), entry in results.items()
        ],
    }
    (out / "table.md").write_text(f"{description}\n\n{text}")
    write_json_atomic(out / "table.json", result)
    if not opts.quiet:
        print(text, file=sys.stderr)
    return result
