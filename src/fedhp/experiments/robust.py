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

``--heterogeneity`` (:func:`heterogeneity`, issue 41) runs another study instead: FedAvg's core
grid over IID / Dirichlet 0.5 / Dirichlet 0.1 / 2 label shards × attack-free, sign flip, ALIE and
IPM at 20 % × mean, median, trimmed mean, Multi-Krum, cclip (τ chosen from 3 scales) and geomed
× buckets {1, 2} × client momentum {0, 0.9} on validation sets; one configuration chosen per
algorithm on the 2-label-shard split (:func:`select`); HierFAVG's stage with FedAvg's best rules
at the edges, the cloud and both; the chosen configurations' test runs over 3 seeds. With
``--methods sfedhp`` (alone, or after ``fedavg,hierfavg``) sFedHP's hierarchy stage, as HierFAVG's
without client momentum (:data:`SFEDHP`, :func:`sfedhp_configs`; issue 41, deliverable 3).
``--later-rows`` then runs the chosen configurations and the clean mean on test under label flip
at 20 %, the core attacks at 10 %, buckets of 5 and on the DNN (:func:`later_groups`).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError
from fedhp.experiments.common import (
    MODELS,
    ReproOptions,
    inputs_text,
    machine,
    run_seeds,
    run_tail,
    write_study,
)
from fedhp.reporting import Line, plot_lines, write_json_atomic
from fedhp.tables import markdown_table, mean_std

ATTACKS = ("sign_flip", "gaussian", "boost", "label_flip", "alie")
FRACTIONS = (0.1, 0.2, 0.3)
RULES = ("mean", "median", "trimmed_mean", "krum", "multi_krum", "clip")
ALGORITHMS = ("fedavg", "hierfavg", "sfedhp")
"""The names ``--methods`` takes (sFedHP: ``--heterogeneity``'s hierarchy stage only)."""
GRID_ALGORITHMS = ("fedavg", "hierfavg")
"""The attack grid's algorithms (``reproduce robust`` without ``--heterogeneity``), and
``--heterogeneity``'s default."""
LABELS = {"fedavg": "FedAvg", "hierfavg": "HierFAVG", "sfedhp": "sFedHP"}
SIGN_SCALE = 4.0
BETA = 0.3
SFEDHP: dict[str, float] = {"R": 10, "K": 1, "lam": 5.0, "edge_lr": 0.4, "beta": 1.0}
"""sFedHP's options in ``--heterogeneity`` (the rest: the robust study's, lr η2 = 0.05, batch 20;
no sparsity): R·K = 10 gradient steps a round like FedAvg's and HierFAVG's; R, K, λ and the
edge step η1 (as η1·λ = 0.75 or 2) chosen on attack-free validation runs of the mean (2 label
shards, seed 0; docs/robustness.md, "sFedHP in the hierarchy stage")."""
SFEDHP_S_EDGE, SFEDHP_S_CLOUD = 0.09, 0.12
LEVELS: dict[tuple[str, str], tuple[int, float]] = {
    # (algorithm, level) -> (Krum's f, clip's S)
    ("fedavg", "cloud"): (30, 0.4),
    ("hierfavg", "edge"): (3, 0.3),
    ("hierfavg", "cloud"): (3, 0.13),
    # sFedHP (--heterogeneity only): its clients' uploads phi_ij - w_i at an edge, its edges'
    # w_i - w at the cloud (median norms in the attack-free mean run, validation, seed 0)
    ("sfedhp", "edge"): (3, SFEDHP_S_EDGE),
    ("sfedhp", "cloud"): (3, SFEDHP_S_CLOUD),
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
        return self.attack if self.placement == "spread" else f"{self.attack}-{self.placement}"

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
            # (the sign flip's scale; the other attacks do not read it, and refuse it)
            *([f"faults.attack.sign_scale={SIGN_SCALE}"] if self.attack == "sign_flip" else []),
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
        return HET_PARTITIONS["iid" if self.iid else "shards2"][1]

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
    if algorithm == "sfedhp":
        return ["algorithm.name=sfedhp", *(f"algorithm.{k}={v:g}" for k, v in SFEDHP.items())]
    return [
        "algorithm.name=hierfavg",
        f"algorithm.kappa1={KAPPA1}",
        f"algorithm.kappa2={STEPS // KAPPA1}",
    ]


def run_overrides(opts: ReproOptions, row: Row, case: Case, seed: int) -> list[str]:
    """Every override of one run."""
    return shared_overrides(
        opts, row.partition(), [*algorithm_overrides(row.algorithm), *row.overrides()], case, seed
    )


def shared_overrides(
    opts: ReproOptions,
    partition: list[str],
    algorithm: list[str],
    case: Case,
    seed: int,
    more: tuple[str, ...] = (),
) -> list[str]:
    """Every override of one robust run: the fixed federation, model and schedule around a
    ``partition``, the ``algorithm``'s options, the attack ``case`` and ``more`` (before the
    seed and the user's own overrides)."""
    model = opts.model or "mlr"
    if model not in MODELS:
        raise ConfigError(f"--model: robust runs {', '.join(MODELS)}; got {model!r}")
    return [
        f"dataset.name={opts.dataset}",
        *([f"dataset.data_dir={opts.data_dir}"] if opts.data_dir else []),
        *partition,
        f"federation.num_clients={CLIENTS}",
        f"federation.num_edges={EDGES}",
        "federation.weighting=uniform",  # (every client each round: client_fraction's default)
        *MODELS[model],
        f"algorithm.batch_size={BATCH}",
        f"algorithm.lr={LR}",
        *algorithm,
        *case.overrides(),
        f"rounds={rounds_of(opts)}",
        f"eval_every={opts.eval_every}",
        "eval_train=false",
        "max_loss=null",  # an attacked run goes on while its loss is finite
        *run_tail(opts, seed, 25, *more),
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
        f"{opts.threads}, {opts.jobs} run(s) at once, {wall:.0f} s of runs in all ({machine()}). "
        f"{inputs_text(opts.dataset, opts.extra)}"
    ).rstrip()


def figures(out: Path, results: dict[tuple[Row, Case], dict[str, Any]], rows: list[Row]) -> None:
    """``sign_flip-<algorithm>.png``: accuracy vs attacker fraction, a line per aggregator (a
    colour per rule; the edge-only rows the same colour with markers)."""
    palette = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
    colors = dict(zip(RULES, palette, strict=True))
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
    algorithms = opts.chosen_methods(GRID_ALGORITHMS, ALGORITHMS)
    if "sfedhp" in algorithms:
        raise ConfigError(
            "--methods: sfedhp runs only in --heterogeneity's hierarchy stage; use fedavg, "
            "hierfavg or add --heterogeneity"
        )
    tag = "quick" if opts.quick else "full"
    out, runs = opts.folders(f"robust-{opts.dataset}-{tag}")
    rows = [row for a in algorithms for row in rows_of(a)]
    done = run_seeds(
        opts,
        [(row, case) for row in rows for case in cases_of(opts, row.algorithm, row.iid)],
        lambda key, seed: run_overrides(opts, *key, seed),
        lambda key: runs / key[0].name / key[0].label / key[1].folder,
        lambda key: f"{key[0].name} {key[0].label} {key[1].folder}",
    )
    wall = sum(float(s.get("seconds", 0.0)) for summaries in done.values() for s in summaries)
    results: dict[tuple[Row, Case], dict[str, Any]] = {}
    for (row, case), summaries in done.items():
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
    return write_study(opts, out, description, text, result)


# ------------------------------------------------------------------------------------------------
# ``fedhp reproduce robust --heterogeneity`` (issue 41, deliverable 4)

HET_ATTACKS = ("none", "sign_flip", "alie", "ipm")
"""Attack-free, then the three attacks of the selection, each at :data:`HET_FRACTION`."""
HET_FRACTION = 0.2
HET_RULES = ("mean", "median", "trimmed_mean", "multi_krum", "cclip", "geomed")
TAU_SCALES = (0.25, 1.0, 2.5)
"""cclip's τ as multiples of the level's benign-update norm S (:data:`LEVELS`): FedAvg's
clients 0.1 / 0.4 / 1.0; chosen on validation like the rest of a configuration."""
QUICK_TAU_SCALES = (1.0,)
BUCKETS = (1, 2)
MOMENTA = (0.0, 0.9)
PLACEMENTS = ("edge", "cloud", "both")
HET_PARTITIONS: dict[str, tuple[str, list[str]]] = {
    # key -> (title, overrides); "iid": Dirichlet sizes with β = 1000 (equal up to ~3 %), labels
    # IID (the attack grid's IID control too)
    "iid": ("IID", ["partition.name=quantity", "partition.beta=1000"]),
    "dir0.5": ("Dirichlet 0.5", ["partition.name=dirichlet", "partition.alpha=0.5"]),
    "dir0.1": ("Dirichlet 0.1", ["partition.name=dirichlet", "partition.alpha=0.1"]),
    "shards2": ("2 label shards", ["partition.name=shards", "partition.shards_per_client=2"]),
}
QUICK_PARTITIONS = ("shards2",)
SELECT_ON = "shards2"
"""The partition on which the configurations are chosen and tested."""
VAL_OVERRIDES = ["partition.val_fraction=0.1", "partition.val_stratified=true"]
"""Every run (validation and test) carves 10 % of each client's training data, per class, as
its validation set, so the chosen configuration's test runs train on the same data."""
CLEAN_SLACK = 0.02
"""A candidate's attack-free validation accuracy must be within 2 points of the clean mean's."""
ATTACK_SLACK = 0.03
"""The must-show: under each attack within 3 points of the clean mean (test, mean of seeds)."""
TOP_RULES, QUICK_TOP_RULES = 2, 1
TEST_SEEDS = 3
TRIVIAL = {"mnist": 0.1135, "fmnist": 0.1}
"""A constant predictor's accuracy: the majority class's share of the evaluated set. MNIST's test
set is not balanced (980–1,135 per class): class 1 holds 1,135 of 10,000 (the clients' test sets
are the whole test set here; the validation sets, carved from the training set, 11.2–11.3 %)."""
FLAG_TRIVIAL, FLAG_STOPPED = " ▼", " †"


@dataclass(frozen=True)
class Config:
    """One configuration: ``rule`` (cclip with ``tau`` = τ's multiple of the level's S), its
    bucket size, the clients' momentum β and, for HierFAVG, where the rule acts (``edge``,
    ``cloud``, ``both``; "" for FedAvg and the mean)."""

    rule: str
    tau: float | None = None
    bucket: int = 1
    momentum: float = 0.0
    placement: str = ""

    @property
    def family(self) -> str:
        """The rule with its τ (``cclip τ=1S``)."""
        return self.rule if self.tau is None else f"{self.rule} τ={self.tau:g}S"

    @property
    def label(self) -> str:
        parts = [self.family]
        if self.bucket > 1:
            parts.append(f"s={self.bucket}")
        if self.momentum:
            parts.append(f"β={self.momentum:g}")
        if self.placement:
            parts.append(f"@{self.placement}")
        return " ".join(parts)

    @property
    def folder(self) -> str:
        parts = [self.rule]
        if self.tau is not None:
            parts.append(f"t{self.tau:g}")
        parts += [f"s{self.bucket}", f"m{self.momentum:g}"]
        if self.placement:
            parts.append(self.placement)
        return "-".join(parts)

    def levels(self, algorithm: str) -> list[str]:
        if algorithm == "fedavg":
            return ["cloud"]
        return {"edge": ["edge"], "cloud": ["cloud"]}.get(self.placement, ["edge", "cloud"])

    def overrides(
        self, algorithm: str, fraction: float = HET_FRACTION, model: str = "mlr"
    ) -> list[str]:
        """The options of this configuration (``fraction``: the attackers Multi-Krum's f and the
        trimmed mean's β are set for; ``model``: whose S sets cclip's τ)."""
        out = [f"algorithm.client_momentum={self.momentum:g}"] if self.momentum else []
        if self.rule == "mean":
            return out
        for level in self.levels(algorithm):
            out.append(f"robust.{level}.name={self.rule}")
            if self.bucket > 1:
                out.append(f"robust.{level}.bucket={self.bucket}")
            if self.rule in ("trimmed_mean", "multi_krum"):
                f = krum_f(algorithm, level, self.bucket, fraction)
                n = level_rows(algorithm, level, self.bucket)
                out.append(
                    f"robust.{level}.beta={f / n:.6g}"
                    if self.rule == "trimmed_mean"
                    else f"robust.{level}.f={f}"
                )
            elif self.rule == "cclip":
                assert self.tau is not None
                tau = cclip_tau(algorithm, level, self.tau, model)
                out.append(f"robust.{level}.tau={tau:.6g}")
        return out


LATER_FRACTION = 0.1
"""The later rows' smaller attacker share (10 of 100 clients)."""
LATER_BUCKET = 5
"""The later rows' bucket size for the chosen configuration (FedAvg's cloud: 20 buckets of 5;
HierFAVG's and sFedHP's edges and cloud: 2 buckets of 5)."""
LATER_MODEL = "dnn"
DNN_S: dict[tuple[str, str], float] = {
    # cclip's S for the DNN (784-100-10), measured as LEVELS' for MLR: the median norm of the
    # benign updates each level receives in the attack-free mean run (2 label shards,
    # validation, seed 0; docs/results/robust-het-later/benign_norms.py)
    ("fedavg", "cloud"): 0.4,
    ("hierfavg", "edge"): 0.31,
    ("hierfavg", "cloud"): 0.14,
    ("sfedhp", "edge"): 0.1,
    ("sfedhp", "cloud"): 0.13,
}

REFERENCE = Config("mean")
"""The clean mean: the plain mean, no bucketing, no momentum (FedAvg's and HierFAVG's)."""


def level_rows(algorithm: str, level: str, bucket: int = 1) -> int:
    """The rows a level's rule sees after bucketing: FedAvg's cloud 100 clients; HierFAVG's edge
    its 10 clients, its cloud the 10 edges; ⌈n/s⌉ with buckets of s."""
    n = CLIENTS if algorithm == "fedavg" else (CLIENTS // EDGES if level == "edge" else EDGES)
    return -(-n // bucket)


def krum_f(algorithm: str, level: str, bucket: int = 1, fraction: float = HET_FRACTION) -> int:
    """Multi-Krum's f on the rows after bucketing: the attackers (20 at 20 %, 10 at the later
    rows' 10 %), capped by n > 2f + 2 (an attacker spoils at most one bucket, so bucketing does
    not raise f): FedAvg 20 of 100 rows and 20 of 50 buckets; HierFAVG 3 of 10 rows and 1 of 5
    buckets at the edges and at the cloud. The trimmed mean trims the same f rows per side
    (β = f / n). A ConfigError when no f fits (fewer than 3 rows: buckets of 5 at an edge)."""
    n = level_rows(algorithm, level, bucket)
    if n < 3:
        raise ConfigError(
            f"buckets of {bucket}: {LABELS[algorithm]}'s {level} sees {n} row(s), and Multi-Krum "
            "and the trimmed mean need at least 3; use cclip, geomed or median there"
        )
    return min(round(fraction * CLIENTS), (n - 3) // 2)


def cclip_tau(algorithm: str, level: str, scale: float, model: str = "mlr") -> float:
    """cclip's τ at a level: ``scale`` × the level's median benign-update norm S (LEVELS; for the
    DNN, :data:`DNN_S`, measured the same way)."""
    if model == "dnn":
        return scale * DNN_S[(algorithm, level)]
    return scale * LEVELS[(algorithm, level)][1]


def het_partitions(opts: ReproOptions) -> tuple[str, ...]:
    return QUICK_PARTITIONS if opts.quick else tuple(HET_PARTITIONS)


def fedavg_configs(opts: ReproOptions) -> list[Config]:
    """FedAvg's candidates: the clean mean (:data:`REFERENCE`, always), then every rule ×
    bucketing × momentum (cclip × τ); the mean without bucketing only (buckets of equal weight
    average to the mean)."""
    taus = QUICK_TAU_SCALES if opts.quick else TAU_SCALES
    out = [REFERENCE]
    for rule in HET_RULES:
        for tau in taus if rule == "cclip" else (None,):
            for bucket in (1,) if rule == "mean" else BUCKETS:
                out += [Config(rule, tau, bucket, momentum) for momentum in MOMENTA]
    return list(dict.fromkeys(out))


def hierfavg_configs(
    families: list[tuple[str, float | None]], momenta: tuple[float, ...] | None = None
) -> list[Config]:
    """HierFAVG's candidates: the mean (± momentum), then each chosen rule (with its τ) at the
    edges, the cloud and both × bucketing × momentum (``momenta``: :data:`MOMENTA` unless given)."""
    momenta = MOMENTA if momenta is None else momenta
    out = [REFERENCE, *(Config("mean", momentum=momentum) for momentum in momenta)]
    for rule, tau in families:
        for placement in PLACEMENTS:
            for bucket in BUCKETS:
                out += [Config(rule, tau, bucket, m, placement) for m in momenta]
    return list(dict.fromkeys(out))


SFEDHP_FAMILIES: tuple[tuple[str, float | None], ...] = (("cclip", 1.0), ("geomed", None))
"""FedAvg's 2 best rules of the full grid (docs/results/robust-het-full.md), with cclip's τ
(×S): sFedHP's candidates where FedAvg's grid is not run alongside (``--methods sfedhp``)."""


def sfedhp_configs(families: list[tuple[str, float | None]]) -> list[Config]:
    """sFedHP's candidates: HierFAVG's without client momentum (sFedHP's clients upload
    ``phi_ij``, a mix of their model and the edge's, not the model they trained:
    ``algorithm.client_momentum`` refuses it)."""
    return hierfavg_configs(families, (0.0,))


def het_test_seeds(opts: ReproOptions) -> range:
    """The chosen configurations' test seeds: max(3, --seeds) (``--quick``: --seeds)."""
    return range(opts.seeds if opts.quick else max(TEST_SEEDS, opts.seeds))


def het_overrides(
    opts: ReproOptions,
    algorithm: str,
    partition: str,
    config: Config,
    attack: str,
    split: str,
    seed: int,
    fraction: float = HET_FRACTION,
) -> list[str]:
    """Every override of one run of the heterogeneity grid (``split``: val or test; ``fraction``:
    the attackers' share, :data:`HET_FRACTION` but in the later rows)."""
    case = Case(attack, 0.0 if attack == "none" else fraction)
    partition_overrides = [*HET_PARTITIONS[partition][1], *VAL_OVERRIDES]
    model = opts.model or "mlr"
    options = [*algorithm_overrides(algorithm), *config.overrides(algorithm, fraction, model)]
    more = (f"eval_split={split}",)
    return shared_overrides(opts, partition_overrides, options, case, seed, more)


Cell = tuple[str, str, Config]
"""(algorithm, partition, configuration)."""
HetKey = tuple[str, str, Config, str]
"""(algorithm, partition, configuration, attack)."""


def run_cells(
    opts: ReproOptions,
    runs: Path,
    cells: list[Cell],
    split: str,
    seeds: range,
    attacks: tuple[str, ...] = HET_ATTACKS,
    fraction: float = HET_FRACTION,
) -> dict[HetKey, dict[str, Any]]:
    """Run (or reuse) every cell × attack × seed on ``split``; one entry per cell and attack:
    ``acc`` (mean over seeds), ``std``, ``stopped``, ``seconds``, ``trivial``, ``accs``. The later
    rows pass their ``attacks`` and ``fraction`` (folder ``<attack>-f<fraction>`` when it is not
    :data:`HET_FRACTION`) and the model in ``opts`` (partition folder ``<partition>-<model>``)."""
    cells = list(dict.fromkeys(cells))
    model = "" if opts.model in (None, "mlr") else f"-{opts.model}"
    tail = "" if fraction == HET_FRACTION else f"-f{fraction:g}"
    done = run_seeds(
        opts,
        [(alg, part, cfg, attack) for alg, part, cfg in cells for attack in attacks],
        lambda k, seed: het_overrides(opts, *k, split, seed, fraction),
        lambda k: runs / k[0] / split / f"{k[1]}{model}" / k[2].folder / f"{k[3]}{tail}",
        lambda k: f"{split} {k[0]} {k[1]}{model} {k[2].folder} {k[3]}{tail}",
        seeds=seeds,
    )
    trivial = TRIVIAL.get(opts.dataset, 0.1)
    out: dict[HetKey, dict[str, Any]] = {}
    for (alg, part, cfg, attack), summaries in done.items():
        for i, summary in enumerate(summaries):
            path = Path(summary["folder"]) / "summary.json"
            if "final_global_acc" not in summary and path.is_file():
                # (a run stopped on non-finite values returns before its summary holds the last
                # evaluated accuracy; the summary it leaves in its folder does)
                summaries[i] = {**summary, **json.loads(path.read_text())}
        # (a run that diverged before its first evaluation has no accuracy: nan, and the
        # cell's mean with it; its non-finite model predicts one class, so it is flagged ▼)
        accs = [float(s.get("final_global_acc", math.nan)) for s in summaries]
        acc, std = mean_std(accs)
        out[(alg, part, cfg, attack)] = {
            "acc": acc,
            "std": std,
            "accs": accs,
            "stopped": [s["stopped"] for s in summaries if s.get("stopped")],
            "seconds": sum(float(s.get("seconds", 0.0)) for s in summaries),
            "trivial": acc <= trivial + 1e-12 or math.isnan(acc),
        }
        gone = " diverged" if out[(alg, part, cfg, attack)]["stopped"] else ""
        where = f"{split} {part}{model} {alg} {cfg.folder} {attack}{tail}"
        print(f"robust-het {where} acc={acc:.4f}{gone}")
    return out


def score(entry: dict[str, Any]) -> float:
    """A validation run's accuracy for the selection: a run that stopped on a non-finite loss
    counts as 0 (it never wins)."""
    return 0.0 if entry["stopped"] else float(entry["acc"])


def select(
    algorithm: str,
    configs: list[Config],
    val: dict[HetKey, dict[str, Any]],
    partition: str | None = None,
) -> list[dict[str, Any]]:
    """The selection on :data:`SELECT_ON`'s validation runs, best first: a candidate is eligible
    when its attack-free accuracy is within 2 points of the clean mean's (:data:`REFERENCE`);
    eligible candidates first, then the best worst case over the three attacks, then the best
    attack-free accuracy, then the grid order. The first row is the chosen configuration
    (``partition``: another partition's ranking, for the figure)."""
    part = partition or SELECT_ON
    clean_mean = score(val[(algorithm, part, REFERENCE, "none")])
    rows = []
    for index, cfg in enumerate(dict.fromkeys(configs)):
        clean = score(val[(algorithm, part, cfg, "none")])
        attacked = {a: score(val[(algorithm, part, cfg, a)]) for a in HET_ATTACKS[1:]}
        rows.append(
            {
                "config": cfg,
                "clean": clean,
                "worst": min(attacked.values()),
                "attacks": attacked,
                "clean_mean": clean_mean,
                "eligible": clean >= clean_mean - CLEAN_SLACK - 1e-9,
                "index": index,
            }
        )
    return sorted(rows, key=lambda r: (not r["eligible"], -r["worst"], -r["clean"], r["index"]))


def best_families(ranking: list[dict[str, Any]], k: int) -> list[tuple[str, float | None]]:
    """The ``k`` best rules other than the mean in ``ranking``'s order, each with the τ of its
    best configuration (HierFAVG's second stage)."""
    out: list[tuple[str, float | None]] = []
    for row in ranking:
        cfg = row["config"]
        if cfg.rule != "mean" and all(cfg.rule != rule for rule, _ in out):
            out.append((cfg.rule, cfg.tau))
    return out[:k]


def cell(entry: dict[str, Any] | None, spread: bool = False) -> str:
    """An accuracy cell in %, ``± std`` with ``spread``; ▼ at or below the trivial baseline,
    † a run that stopped on a non-finite loss."""
    if entry is None:
        return "—"
    if math.isnan(entry["acc"]):  # a seed diverged before its first evaluation
        return "n/a" + FLAG_TRIVIAL + FLAG_STOPPED
    text = f"{100 * entry['acc']:.2f}"
    if spread:
        text += f" ± {100 * entry['std']:.2f}"
    return (
        text
        + (FLAG_TRIVIAL if entry["trivial"] else "")
        + (FLAG_STOPPED if entry["stopped"] else "")
    )


ATTACK_TITLES = {
    "none": "attack-free",
    "sign_flip": "sign flip",
    "alie": "ALIE",
    "ipm": "IPM",
    "label_flip": "label flip",
}


def levels_table(algorithms: list[str], opts: ReproOptions) -> str:
    """Each level's rows and rule parameters, without and with bucketing."""
    body = []
    for algorithm in algorithms:
        for level in ["cloud"] if algorithm == "fedavg" else ["edge", "cloud"]:
            taus = QUICK_TAU_SCALES if opts.quick else TAU_SCALES
            for bucket in BUCKETS:
                n, f = level_rows(algorithm, level, bucket), krum_f(algorithm, level, bucket)
                body.append(
                    [
                        LABELS[algorithm],
                        level,
                        str(level_rows(algorithm, level)),
                        str(bucket),
                        str(n),
                        str(f),
                        str(n - f),
                        f"{f / n:.2g} ({f} per side)",
                        " / ".join(f"{cclip_tau(algorithm, level, t):.4g}" for t in taus),
                    ]
                )
    header = [
        "algorithm",
        "level",
        "rows",
        "s",
        "rows after bucketing",
        "Multi-Krum f",
        "Multi-Krum m",
        "trimmed mean share per side",
        "cclip τ",
    ]
    return "### Rule parameters per level\n\n" + markdown_table(header, body)


def grid_table(
    val: dict[HetKey, dict[str, Any]],
    partitions: tuple[str, ...],
    configs: list[Config],
    trivial: float,
) -> str:
    """FedAvg's core grid: a row per partition and configuration (validation, seed 0)."""
    body = []
    for part in partitions:
        for cfg in configs:
            entries = [val.get(("fedavg", part, cfg, a)) for a in HET_ATTACKS]
            if any(e is None for e in entries):
                continue
            worst = min(score(e) for e in entries[1:] if e is not None)
            body.append(
                [
                    HET_PARTITIONS[part][0],
                    cfg.label,
                    *(cell(e) for e in entries),
                    flagged(worst, trivial),
                ]
            )
    header = ["partition", "configuration", *(ATTACK_TITLES[a] for a in HET_ATTACKS), "worst"]
    return "### FedAvg: the core grid (validation accuracy %, seed 0)\n\n" + markdown_table(
        header, body
    )


def flagged(value: float, trivial: float) -> str:
    """A score in % (▼ at or below the trivial baseline)."""
    return f"{100 * value:.2f}" + (FLAG_TRIVIAL if value <= trivial + 1e-12 else "")


def selection_table(algorithm: str, ranking: list[dict[str, Any]], trivial: float) -> str:
    """The candidates on :data:`SELECT_ON`, best first; the chosen one in bold."""
    body = []
    for i, row in enumerate(ranking):
        label = row["config"].label
        body.append(
            [
                f"**{label}**" if i == 0 else label,
                flagged(row["clean"], trivial),
                f"{100 * (row['clean'] - row['clean_mean']):+.2f}",
                "yes" if row["eligible"] else "no",
                *(flagged(row["attacks"][a], trivial) for a in HET_ATTACKS[1:]),
                flagged(row["worst"], trivial),
            ]
        )
    header = [
        "configuration",
        "attack-free",
        "Δ clean mean",
        "within 2 points",
        *(ATTACK_TITLES[a] for a in HET_ATTACKS[1:]),
        "worst",
    ]
    title = HET_PARTITIONS[SELECT_ON][0]
    return (
        f"### {LABELS[algorithm]}: the selection ({title}, validation accuracy %, seed 0; "
        "diverged runs count as 0)\n\n" + markdown_table(header, body)
    )


def verdict(
    chosen: dict[str, dict[str, Any]], reference: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The must-show checks on the test runs: each attack within 3 points of the clean mean's
    attack-free accuracy, the attack-free accuracy within 2 points of it."""
    clean_mean = reference["none"]["acc"]
    gaps = {a: chosen[a]["acc"] - clean_mean for a in HET_ATTACKS}
    ok_attacks = all(gaps[a] >= -ATTACK_SLACK - 1e-9 for a in HET_ATTACKS[1:])
    ok_clean = gaps["none"] >= -CLEAN_SLACK - 1e-9
    return {"clean_mean": clean_mean, "gaps": gaps, "holds": ok_attacks and ok_clean}


def test_stage_table(
    algorithms: list[str],
    chosen: dict[str, Config],
    test: dict[HetKey, dict[str, Any]],
    seeds: range,
) -> str:
    """The chosen configurations and the clean mean on the test set (mean ± std over seeds)."""
    body = []
    for algorithm in algorithms:
        for cfg in dict.fromkeys([chosen[algorithm], REFERENCE]):
            entries = {a: test[(algorithm, SELECT_ON, cfg, a)] for a in HET_ATTACKS}
            ref = {a: test[(algorithm, SELECT_ON, REFERENCE, a)] for a in HET_ATTACKS}
            check = verdict(entries, ref)
            worst = min(check["gaps"][a] for a in HET_ATTACKS[1:])
            body.append(
                [
                    LABELS[algorithm],
                    cfg.label + (" (chosen)" if cfg == chosen[algorithm] else ""),
                    *(cell(entries[a], spread=True) for a in HET_ATTACKS),
                    f"{100 * worst:+.2f}",
                    f"{100 * check['gaps']['none']:+.2f}",
                    "yes" if check["holds"] else "no",
                ]
            )
    header = [
        "algorithm",
        "configuration",
        *(ATTACK_TITLES[a] for a in HET_ATTACKS),
        "worst attack Δ clean mean",
        "attack-free Δ clean mean",
        "within 3 / 2 points",
    ]
    return (
        f"### The chosen configurations on the test set ({HET_PARTITIONS[SELECT_ON][0]}, "
        f"mean ± std over seeds 0..{len(seeds) - 1})\n\n" + markdown_table(header, body)
    )


def het_describe(opts: ReproOptions, algorithms: list[str], wall: float, runs: int) -> str:
    model = opts.model or "mlr"
    parts = ", ".join(HET_PARTITIONS[p][0] for p in het_partitions(opts))
    taus = QUICK_TAU_SCALES if opts.quick else TAU_SCALES
    top = QUICK_TOP_RULES if opts.quick else TOP_RULES
    trivial = TRIVIAL.get(opts.dataset, 0.1)
    return (
        f"{opts.dataset}, {CLIENTS} clients ({parts}; 10 % of each client's training data, per "
        f"class, is its validation set in every run), {EDGES} edges of {CLIENTS // EDGES}, "
        f"uniform weighting, all clients every round; {rounds_of(opts)} rounds of {STEPS} local "
        f"SGD steps (HierFAVG κ1 = {KAPPA1}, κ2 = {STEPS // KAPPA1}), batch {BATCH}, lr {LR}, "
        f"model {model}. Attacks at {100 * HET_FRACTION:g} % (spread): sign flip s = "
        f"{SIGN_SCALE:g}, ALIE z = Baruch's z_max, IPM ε = 0.1. Rules: median; trimmed mean and "
        f"Multi-Krum with f = the attackers capped by n > 2f + 2 on the rows after bucketing "
        f"(trimmed mean β = f/n, Multi-Krum m = n − f; table below); cclip L = 3, τ ∈ "
        f"{{{', '.join(f'{t:g}' for t in taus)}}} × the level's benign-update norm S (0.4 FedAvg, "
        f"0.3 HierFAVG edges, 0.13 HierFAVG cloud), chosen on validation; geomed RFA's defaults; "
        f"buckets s ∈ {{1, 2}}; client momentum β ∈ {{0, 0.9}}. Selection on "
        f"{HET_PARTITIONS[SELECT_ON][0]} (validation, seed 0): among the configurations whose "
        f"attack-free accuracy is within {100 * CLEAN_SLACK:g} points of the clean mean's (the "
        f"plain mean, no buckets, no momentum), the best worst case over sign flip, ALIE and IPM "
        f"(then the best attack-free accuracy); HierFAVG's candidates: the {top} best rules of "
        f"FedAvg's ranking at the edges, the cloud and both.{sfedhp_text(opts, algorithms)} "
        f"Test: the chosen configuration and "
        f"the clean mean, seeds 0..{len(het_test_seeds(opts)) - 1}. Algorithms: "
        f"{', '.join(LABELS[a] for a in algorithms)}. ▼: at or below the trivial baseline "
        f"{100 * trivial:.2f} % (a constant predictor of the majority class); † a run stopped on "
        f"a non-finite loss (its last evaluated accuracy; 0 in the selection). {runs} runs, "
        f"{wall:.0f} s of runs in all (torch threads {opts.threads}, {opts.jobs} run(s) at once; "
        f"{machine()}). "
        f"{inputs_text(opts.dataset, opts.extra)}"
    ).rstrip()


def sfedhp_text(opts: ReproOptions, algorithms: list[str]) -> str:
    """The sentence on sFedHP's stage in the description (empty without it)."""
    if "sfedhp" not in algorithms:
        return ""
    o = SFEDHP
    top = QUICK_TOP_RULES if opts.quick else TOP_RULES
    source = f"the {top} best rules of FedAvg's ranking"
    if "fedavg" not in algorithms:
        rules = ", ".join(
            rule if tau is None else f"{rule} τ={tau:g}S" for rule, tau in SFEDHP_FAMILIES[:top]
        )
        source = f"{rules} (FedAvg's {top} best rule(s) in the full grid, robust-het-full)"
    return (
        f" sFedHP: R = {o['R']:g} local rounds of K = {o['K']:g} step(s) on one minibatch, "
        f"λ1 = λ2 = {o['lam']:g}, η2 = lr {LR}, η1 = {o['edge_lr']:g}, cloud β = "
        f"{o['beta']:g}, no sparsity (chosen on attack-free validation runs); cclip's S "
        f"{LEVELS[('sfedhp', 'edge')][1]:g} at the edges (the uploads φ_ij − w_i), "
        f"{LEVELS[('sfedhp', 'cloud')][1]:g} at the cloud (w_i − w); its candidates: the mean "
        f"and {source} at the edges, the cloud and both × buckets, no client momentum "
        f"(sFedHP's clients upload φ_ij, not the models they trained)."
    )


def het_figure(
    out: Path,
    val: dict[HetKey, dict[str, Any]],
    partitions: tuple[str, ...],
    configs: list[Config],
    test: dict[HetKey, dict[str, Any]],
    chosen: dict[str, Config],
    trivial: float,
) -> None:
    """``heterogeneity.png``: left, FedAvg's worst case over the three attacks against the
    partition, a line per rule (its best configuration per partition, selection order), the
    clean mean's attack-free accuracy (black) and the trivial baseline (grey); right, the test
    runs of the chosen configurations (o) and of the clean mean (x) per attack, ± std."""
    from matplotlib.figure import Figure

    from fedhp.reporting import _save, draw_lines

    fig = Figure(figsize=(12.0, 4.6))
    left, right = fig.subplots(1, 2)
    xs = list(range(len(partitions)))
    lines = []
    for rule in HET_RULES:
        ys = []
        for part in partitions:
            mine = [c for c in configs if c.rule == rule]
            ys.append(select("fedavg", mine, val, part)[0]["worst"] if mine else math.nan)
        lines.append(Line(rule, xs, ys, marker="o"))
    clean = [val[("fedavg", p, REFERENCE, "none")]["acc"] for p in partitions]
    lines.append(Line("mean, attack-free", xs, clean, color="black", marker="x"))
    lines.append(Line("trivial", xs, [trivial] * len(xs), color="grey", alpha=0.6))
    draw_lines(left, lines, "partition", "worst-case validation accuracy", "FedAvg (seed 0)")
    left.set_xticks(xs, [HET_PARTITIONS[p][0] for p in partitions])
    ax_lines = []
    colors = ("tab:blue", "tab:orange", "tab:green")
    for (algorithm, cfg), color in zip(chosen.items(), colors, strict=False):
        for c, style, alpha in ((cfg, "o", 1.0), (REFERENCE, "x", 0.5)):
            entries = [test[(algorithm, SELECT_ON, c, a)] for a in HET_ATTACKS]
            label = f"{LABELS[algorithm]} {c.label}"
            ax_lines.append(
                Line(
                    label,
                    list(range(len(HET_ATTACKS))),
                    [e["acc"] for e in entries],
                    std=[e["std"] for e in entries],
                    color=color,
                    alpha=alpha,
                    marker=style,
                )
            )
    draw_lines(right, ax_lines, "attack (20 %)", "test accuracy", "chosen vs the mean")
    right.set_xticks(range(len(HET_ATTACKS)), [ATTACK_TITLES[a] for a in HET_ATTACKS])
    fig.tight_layout()
    _save(fig, out / "heterogeneity.png")


def config_dict(cfg: Config) -> dict[str, Any]:
    return {
        "label": cfg.label,
        "rule": cfg.rule,
        "tau_scale": cfg.tau,
        "bucket": cfg.bucket,
        "momentum": cfg.momentum,
        "placement": cfg.placement,
    }


def entries_json(results: dict[HetKey, dict[str, Any]], split: str) -> list[dict[str, Any]]:
    return [
        {
            "split": split,
            "algorithm": alg,
            "partition": part,
            "config": config_dict(cfg),
            "attack": attack,
            **entry,
        }
        for (alg, part, cfg, attack), entry in results.items()
    ]


def ranking_json(ranking: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**{k: v for k, v in row.items() if k != "config"}, "config": config_dict(row["config"])}
        for row in ranking
    ]


# The later rows (issue 41, deliverable 4: "then 3 seeds, label flip, 10 % attackers, s = 5 and a
# DNN only for the rows the summary ranks"): the chosen configurations and the clean mean again,
# on the test set over the test seeds, after the test stage of the full size.


@dataclass(frozen=True)
class Later:
    """One group of later rows: ``attacks`` at ``fraction``; ``bucket``: the chosen configuration
    with buckets of that size instead (the mean is not rerun: buckets of equal size average to
    the mean, its runs are the test stage's); ``model``: another model than the run's."""

    name: str
    title: str
    attacks: tuple[str, ...]
    fraction: float = HET_FRACTION
    bucket: int | None = None
    model: str | None = None

    def row_title(self, attack: str) -> str:
        share = "" if attack == "none" else f" {100 * self.fraction:g} %"
        head = f"{self.title}: " if self.bucket or self.model else ""
        return f"{head}{ATTACK_TITLES[attack]}{share}"


def later_groups(opts: ReproOptions) -> list[Later]:
    """The later rows (``--later-rows``): label flip at 20 %; sign flip, ALIE and IPM at 10 %;
    buckets of 5 under the core attacks at 20 % (and attack-free); the DNN attack-free and under
    the core attacks at 20 % (left out when the run's model is already the DNN). ``--quick``:
    the same rows at its size (10 rounds, ``--seeds`` seeds)."""
    groups = [
        Later("label_flip", "label flip", ("label_flip",)),
        Later("f0.1", "10 % attackers", HET_ATTACKS[1:], LATER_FRACTION),
        Later(f"s{LATER_BUCKET}", f"s = {LATER_BUCKET}", HET_ATTACKS, bucket=LATER_BUCKET),
    ]
    if (opts.model or "mlr") != LATER_MODEL:
        groups.append(Later(LATER_MODEL, "DNN 784-100-10", HET_ATTACKS, model=LATER_MODEL))
    return groups


def later_cells(group: Later, algorithms: list[str], chosen: dict[str, Config]) -> list[Cell]:
    """A group's cells: each algorithm's chosen configuration and the clean mean, or with
    ``bucket`` the chosen configuration re-bucketed (none when the mean was chosen)."""
    cells: list[Cell] = []
    for alg in algorithms:
        if group.bucket is not None:
            if chosen[alg].rule != "mean":
                cells.append((alg, SELECT_ON, replace(chosen[alg], bucket=group.bucket)))
        else:
            cells += [(alg, SELECT_ON, chosen[alg]), (alg, SELECT_ON, REFERENCE)]
    return list(dict.fromkeys(cells))


def later_opts(opts: ReproOptions, group: Later) -> ReproOptions:
    """The options of a group's runs: the run's, with the group's model."""
    return replace(opts, model=group.model) if group.model else opts


def gap(entry: dict[str, Any], base: dict[str, Any] | None) -> str:
    """``entry``'s accuracy minus ``base``'s in points ("—" without one of them)."""
    if base is None or math.isnan(entry["acc"]) or math.isnan(base["acc"]):
        return "—"
    return f"{100 * (entry['acc'] - base['acc']):+.2f}"


def later_table(
    algorithm: str,
    chosen: Config,
    groups: list[Later],
    later: dict[str, dict[HetKey, dict[str, Any]]],
    test: dict[HetKey, dict[str, Any]],
    seeds: range,
) -> str:
    """An algorithm's later rows: the chosen configuration and the clean mean per setting (mean ±
    std over the seeds), the chosen one's distance to its own attack-free accuracy and to the
    clean mean's (the same model's: the test stage's for MLR, the DNN group's for the DNN)."""
    body = []
    for group in groups:
        if group.name not in later:
            continue
        results = {**test, **later[group.name]} if group.model is None else later[group.name]
        own = results.get((algorithm, SELECT_ON, chosen, "none"))
        ref = results.get((algorithm, SELECT_ON, REFERENCE, "none"))
        cfg = chosen if group.bucket is None else replace(chosen, bucket=group.bucket)
        for attack in group.attacks:
            mine = later[group.name].get((algorithm, SELECT_ON, cfg, attack))
            if mine is None:
                continue
            mean = results.get((algorithm, SELECT_ON, REFERENCE, attack))
            if group.bucket is not None:  # the mean with buckets is the mean: the test stage's
                mean = test.get((algorithm, SELECT_ON, REFERENCE, attack))
            body.append(
                [
                    group.row_title(attack),
                    cell(mine, spread=True),
                    cell(mean, spread=True),
                    gap(mine, own),
                    gap(mine, ref),
                ]
            )
    header = [
        "setting",
        f"chosen: {chosen.label}",
        "the mean",
        "chosen Δ its own attack-free",
        "chosen Δ clean mean attack-free",
    ]
    return (
        f"### {LABELS[algorithm]}: the later rows ({HET_PARTITIONS[SELECT_ON][0]}, test, mean ± "
        f"std over seeds 0..{len(seeds) - 1}; s = {LATER_BUCKET}: the chosen configuration with "
        f"buckets of {LATER_BUCKET}, the mean's column the test stage's plain mean)\n\n"
        + markdown_table(header, body)
    )


def later_text(algorithms: list[str]) -> str:
    """The later rows' sentence in the description."""
    taus = ", ".join(
        f"{LABELS[a]} {' / '.join(f'{DNN_S[(a, lv)]:g}' for lv in levels)}"
        for a in algorithms
        for levels in [["cloud"] if a == "fedavg" else ["edge", "cloud"]]
    )
    return (
        f" Later rows (test, the test seeds): the chosen configuration and the clean mean under "
        f"label flip at {100 * HET_FRACTION:g} % (y → 9 − y), sign flip / ALIE / IPM at "
        f"{100 * LATER_FRACTION:g} % (Multi-Krum's f and the trimmed mean's share set for "
        f"{round(LATER_FRACTION * CLIENTS)} attackers), the chosen configuration with buckets of "
        f"{LATER_BUCKET} (attack-free and the core attacks at {100 * HET_FRACTION:g} %), and "
        f"both on the DNN 784-100-10 (attack-free and the core attacks at "
        f"{100 * HET_FRACTION:g} %; cclip's τ = its scale × the DNN's own S, measured as MLR's: "
        f"{taus})."
    )


def heterogeneity(name: str, opts: ReproOptions, later: bool = False) -> dict[str, Any]:
    """``fedhp reproduce robust --heterogeneity`` (issue 41, deliverable 4; the stages: the
    module's docstring). Prints the result lines, writes ``table.md`` / ``table.json`` and
    ``heterogeneity.png`` (sFedHP alone: in ``robust-heterogeneity-sfedhp-*``, its candidates
    from :data:`SFEDHP_FAMILIES`, without FedAvg's grid and the figure)."""
    if name != "robust":
        raise ConfigError(f"--heterogeneity: only with `reproduce robust`; got {name!r}")
    if opts.dataset not in ("mnist", "fmnist"):
        raise ConfigError(f"--dataset: robust runs mnist or fmnist; got {opts.dataset!r}")
    chosen_names = opts.chosen_methods(GRID_ALGORITHMS, ALGORITHMS)
    algorithms = [a for a in ALGORITHMS if a in chosen_names]
    if "fedavg" not in algorithms and algorithms != ["sfedhp"]:
        raise ConfigError(
            "--methods: --heterogeneity chooses HierFAVG's rules from FedAvg's grid; use "
            "fedavg, fedavg,hierfavg (,sfedhp) or sfedhp alone"
        )
    tag = "quick" if opts.quick else "full"
    alone = "" if "fedavg" in algorithms else "sfedhp-"  # sFedHP's stage alone: its own folder
    out, runs = opts.folders(f"robust-heterogeneity-{alone}{opts.dataset}-{tag}")
    partitions = het_partitions(opts)
    top = QUICK_TOP_RULES if opts.quick else TOP_RULES
    configs: dict[str, list[Config]] = {}
    val: dict[HetKey, dict[str, Any]] = {}
    rankings: dict[str, list[dict[str, Any]]] = {}
    families = list(SFEDHP_FAMILIES[:top])
    if "fedavg" in algorithms:
        configs["fedavg"] = fedavg_configs(opts)
        cells = [("fedavg", p, c) for p in partitions for c in configs["fedavg"]]
        val.update(run_cells(opts, runs, cells, "val", range(1)))
        rankings["fedavg"] = select("fedavg", configs["fedavg"], val)
        families = best_families(rankings["fedavg"], top)
    for alg, make in (("hierfavg", hierfavg_configs), ("sfedhp", sfedhp_configs)):
        if alg in algorithms:  # the hierarchy stage: FedAvg's best rules at either level
            configs[alg] = make(families)
            cells = [(alg, SELECT_ON, c) for c in configs[alg]]
            val.update(run_cells(opts, runs, cells, "val", range(1)))
            rankings[alg] = select(alg, configs[alg], val)
    chosen = {alg: rankings[alg][0]["config"] for alg in algorithms}
    for alg in algorithms:
        print(f"robust-het chosen {alg} {chosen[alg].folder}", flush=True)
    seeds = het_test_seeds(opts)
    test_cells = [(alg, SELECT_ON, c) for alg in algorithms for c in (chosen[alg], REFERENCE)]
    test = run_cells(opts, runs, test_cells, "test", seeds)
    checks = {
        alg: verdict(
            {a: test[(alg, SELECT_ON, chosen[alg], a)] for a in HET_ATTACKS},
            {a: test[(alg, SELECT_ON, REFERENCE, a)] for a in HET_ATTACKS},
        )
        for alg in algorithms
    }
    wall = sum(e["seconds"] for e in (*val.values(), *test.values()))
    count = len(val) + len(test) * len(seeds)
    description = het_describe(opts, algorithms, wall, count)
    trivial = TRIVIAL.get(opts.dataset, 0.1)
    parts = [
        test_stage_table(algorithms, chosen, test, seeds),
        *(selection_table(alg, rankings[alg], trivial) for alg in algorithms),
        levels_table(algorithms, opts),
    ]
    out.mkdir(parents=True, exist_ok=True)
    if "fedavg" in configs:  # FedAvg's grid: its table, and the figure (its left panel)
        parts.append(grid_table(val, partitions, configs["fedavg"], trivial))
        het_figure(out, val, partitions, configs["fedavg"], test, chosen, trivial)
    text = "\n".join(parts)
    groups = later_groups(opts) if later else []
    if groups:
        description += later_text(algorithms)
    result = {
        "dataset": opts.dataset,
        "quick": opts.quick,
        "rounds": rounds_of(opts),
        "test_seeds": len(seeds),
        "trivial": trivial,
        "description": description,
        "levels": {
            f"{alg}-{level}-s{bucket}": {
                "rows": level_rows(alg, level, bucket),
                "f": krum_f(alg, level, bucket),
                "tau": [cclip_tau(alg, level, t) for t in TAU_SCALES],
            }
            for alg in algorithms
            for level in (["cloud"] if alg == "fedavg" else ["edge", "cloud"])
            for bucket in BUCKETS
        },
        "chosen": {alg: config_dict(cfg) for alg, cfg in chosen.items()},
        "must_show": checks,
        "selection": {alg: ranking_json(rankings[alg]) for alg in algorithms},
        "results": entries_json(val, "val") + entries_json(test, "test"),
    }
    (out / "table.md").write_text(f"{description}\n\n{text}")
    write_json_atomic(out / "table.json", result)
    rows: dict[str, dict[HetKey, dict[str, Any]]] = {}
    tables: list[str] = []
    for group in groups:  # (the tables are rewritten after each group: a long stage shows)
        cells = later_cells(group, algorithms, chosen)
        rows[group.name] = run_cells(
            later_opts(opts, group), runs, cells, "test", seeds, group.attacks, group.fraction
        )
        tables = [later_table(alg, chosen[alg], groups, rows, test, seeds) for alg in algorithms]
        result["later"] = [
            {"group": g.name, "fraction": g.fraction, "model": g.model or opts.model or "mlr", **e}
            for g in groups
            if g.name in rows
            for e in entries_json(rows[g.name], "test")
        ]
        result["later_seconds"] = sum(e["seconds"] for r in rows.values() for e in r.values())
        (out / "table.md").write_text(f"{description}\n\n{text}\n" + "\n".join(tables))
        write_json_atomic(out / "table.json", result)
    if not opts.quiet:
        print("\n".join([text, *tables]), file=sys.stderr)
    return result
