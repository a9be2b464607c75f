"""Every GPU check of an issue in one script of under 8 minutes, with one table printed last.

On a GPU host (python3.12 + torch, no package index; docs/gpu.md), from the project root:

    bash ../shared/gpu/prepare.sh     # once, on a machine with the project's .venv (fills .gpu/)
    . .gpu/env.sh && python3 benchmarks/gpu_check.py

Pieces, each in its own subprocess with its own time box (a slow piece is cut off and reported,
the others still run):

* ``tests``: ``pytest tests/engine/test_gpu.py`` (skipped without CUDA);
* ``table:<row>``: one row of ``bench_engine.py``'s device table at fp32 (the engine against the
  per-client loop, and the sFedHP / FedAvg rounds at scale);
* ``bf16:<row>``: VGG-11-BN and ResNet-18's rows at ``precision=bf16``;
* ``run``: ``fedhp run device=cuda`` of the default experiment (summary.json ``seconds``).

``--issue 32`` (text) runs these instead (the plays must be in ``$FEDHP_DATA_DIR/shakespeare``:
``cp -r .venv/share/fedhp/shakespeare .gpu/data/`` after ``prepare.sh``):

* ``lstm``: ``bench_lstm.py --device cuda`` at LEAF's size (20 clients × 256 units) and 100 × 16,
  the batched LSTM against the per-client ``nn.LSTM`` loop (cuDNN) on identical minibatches;
* ``leaf-round``: ``fedhp reproduce leaf-shakespeare --methods fedavg`` at the paper's scale for
  2 rounds of 1 local epoch (not 20) on the device; ``round_s``, the second round's seconds
  (one local epoch of 10 clients and one evaluation of every test window), and
  ``full_run_h``, 40 rounds × 20 epochs × ``round_s`` (an upper bound of the paper's FedAvg run:
  it counts the evaluation 20 times a round).

``--issue 40`` (batched runs, Call A) runs these (about 7.5 minutes of time boxes):

* ``sweep-lam``: ``bench_sweep.py --device cuda --inprocess``: the 15-run λ sweep (sFedHP
  defaults, λ ∈ {15, ..., 35} × seeds {0, 1, 2}, 20 rounds) in one process, start-up excluded
  (one warm-up batch first): the batch one run after another, then in lockstep (their model
  kernels fused); ``speedup`` = sequential seconds / lockstep seconds (target ≥ 10);
* ``run`` (above; target ≤ 10 s);
* ``run-graphs``: the same run with ``engine.cuda_graphs=true`` (sFedHP's θ steps replayed as
  CUDA graphs, :mod:`fedhp.engine.graphs`; target ≤ 10 s); ``fallbacks`` counts the warning
  lines of keys that ran without a graph (0 expected);
* ``graph-probe``: ``gpu_graph_probe.py``: one sFedHP θ subproblem (K steps of the default run's
  20 clients) eager against captured once as a CUDA graph and replayed — what Deliver 4 would
  gain, measured before it is built;
* then the earlier GPU issue's open rows: the FedAvg 10k and
  sFedHP 1k rows, ``tests``, VGG-11-BN at fp32 and bf16.

``--issue 40b`` (Call B): ``fedhp reproduce sfedhp-table1 --dataset mnist --setting 1 --model
dnn-500-200 --rounds 800 --seeds 3 device=cuda``, one piece per method (``reproduce:<method>``,
sFedHP and HierFAVG first; its 3 seeds batched), as many as the 470 s deadline holds;
``method_s`` is the piece's wall time (start-up included), ``run_s`` a seed's round loop
(summary.json ``seconds``), ``final_pct`` the table's final accuracy (the global model's, else
the personalized one's). A method cut off reports the rounds its runs reached (timings.csv) and
the round loop they project to.
``--issue 54``: the same for Table I's Fashion-MNIST Setting 1 rows (``reproduce-fmnist:<method>``:
sFedHP, HierFAVG, FedAvg, FedProx, pFedMe; ``--dataset fmnist``, all else as Call B).
``--issue 40c`` (optional, after Call A): ``sweep-lam`` again, then ``sweep-graphs``, the λ
sweep with ``engine.cuda_graphs=true`` (every run alone and the stacked rounds with their θ
steps replayed as CUDA graphs; ``vs_plain``: ``sweep-lam``'s sequential batch over this
lockstep batch, the ≥ 10× row with graphs), then ``sweep:<method>``, the same 15-run sweep
for every other method whose rounds stack as rows (:data:`SWEEP_METHODS`: its grid key and
values), as many as the 470 s deadline holds.
``--keep DIR`` copies each piece's small result files (tables, summaries, metrics, logs) into
``DIR/<piece>`` (the tables of Call B are the results to commit).

The last lines are the table: each must-show with its measured value and target.
``--device cpu --smoke`` runs every piece at tiny sizes on the CPU (tests/benchmarks check it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TABLE_ROWS = [
    "fedavg-dnn100-10k",
    "sfedhp-dnn100-1k",
    "dnn100-1k",
    "cnn2-10",
    "vgg11-bn-10",
    "resnet18-10",
]
BF16_ROWS = ["vgg11-bn-10", "resnet18-10"]
ISSUE_PIECES = {
    "35": [
        "tests",
        *[f"table:{row}" for row in TABLE_ROWS],
        *[f"bf16:{row}" for row in BF16_ROWS],
        "run",
    ],
    "32": ["lstm", "leaf-round"],
    "40": [
        "sweep-lam",
        "run",
        "run-graphs",
        "graph-probe",
        "table:fedavg-dnn100-10k",
        "table:sfedhp-dnn100-1k",
        "tests",
        "table:vgg11-bn-10",
        "bf16:vgg11-bn-10",
    ],
}
REPRODUCE_METHODS = (
    "sfedhp",
    "hierfavg",
    "fedavg",
    "fedprox",
    "pfedme",
    "pfedgp",
    "centralized",
    "local",
)
"""``--issue 40b``'s methods of ``sfedhp-table1``, in the order they run (the paper model's rows
the issue asks for first)."""
ISSUE_PIECES["40b"] = [f"reproduce:{m}" for m in REPRODUCE_METHODS]
FMNIST_METHODS = ("sfedhp", "hierfavg", "fedavg", "fedprox", "pfedme")
"""``--issue 54``'s methods: Table I's Fashion-MNIST Setting 1 rows at the paper's model
(``reproduce-fmnist:<method>``), as Call B runs MNIST's."""
ISSUE_PIECES["54"] = [f"reproduce-fmnist:{m}" for m in FMNIST_METHODS]
SWEEP_METHODS = {
    "pfedme": ("algorithm.lam", "15,20,25,30,35"),
    "fedprox": ("algorithm.mu", "0.001,0.01,0.1,0.5,1"),
    "scaffold": ("algorithm.server_lr", "0.5,0.75,1,1.5,2"),
    "ditto": ("algorithm.lam", "0.05,0.1,0.5,1,2"),
    "hierfavg": ("algorithm.lr", "0.02,0.03,0.05,0.07,0.1"),
    "perfedavg": ("algorithm.beta", "0.001,0.002,0.005,0.01,0.02"),
    "heurfedamp": ("algorithm.lam", "0.5,1,2,4,8"),
    "centralized": ("algorithm.lr", "0.01,0.02,0.05,0.1,0.2"),
}
"""``--issue 40c``'s sweeps (``sweep:<method>``): the λ sweep's shape (15 runs, 20 rounds, one
process) for every other method whose rounds stack as rows over a grid, the grids of
``benchmarks/run_rows_ops.py`` (FedAvg's path is FedProx's; HierFAVG's lr grid stacks its seeds
per lr value)."""
ISSUE_PIECES["40c"] = ["sweep-lam", "sweep-graphs", *(f"sweep:{m}" for m in SWEEP_METHODS)]
ISSUE_DEADLINE = {"40b": 470.0, "40c": 470.0, "54": 470.0}
"""An issue's default ``--deadline`` (its time boxes add up to more than its call may take)."""
TABLE1 = ["--dataset", "mnist", "--setting", "1", "--model", "dnn-500-200", "--rounds", "800"]
TABLE1_SEEDS = 3
SMOKE_TABLE1 = ["--dataset", "mnist", "--setting", "1", "--model", "dnn", "--rounds", "2"]
LEAF_ROUNDS, LEAF_EPOCHS = 40, 20
"""The FedProx paper's Shakespeare run: rounds and local epochs (``leaf-round`` extrapolates)."""
BUDGET_TABLE1 = {"sfedhp": 360, "hierfavg": 360}
"""A Table I piece's box where not 150 s (100 local steps a round)."""
# piece -> seconds it may take on the GPU host (sum 480 s = 8 min). Sized from an H100 run of
# 2026-11-26 (docs/gpu.md): the FedAvg 10k row took 16 s, cnn2 27 s, the run 41 s (30.7 of them
# training); a local row prints its times before its launch profile, so a cut-off row keeps them.
BUDGET = {
    "tests": 100,
    "table:fedavg-dnn100-10k": 25,
    "table:sfedhp-dnn100-1k": 25,
    "table:dnn100-1k": 40,
    "table:cnn2-10": 35,
    "table:vgg11-bn-10": 55,
    "table:resnet18-10": 65,
    "bf16:vgg11-bn-10": 40,
    "bf16:resnet18-10": 45,
    "run": 50,
    "run-graphs": 40,
    "lstm": 90,
    "leaf-round": 300,
    # issue 40 (Call A: 445 s with the rows above). On the H100 the default run took 30.7 s
    # for 250 rounds: the 15 x 20 rounds one after another ~40-60 s, the warm-up and the
    # lockstep batch less; the sequential batch prints its line first (kept if cut off).
    "sweep-lam": 110,  # 68.9 s on an H200 (2026-11-27)
    "graph-probe": 30,
    # issue 40b (Call B, a 470 s deadline). Measured on an H200 (2026-11-27): sFedHP's 3 seeds
    # in lockstep reached round 750 of 800 in 300 s (310 s of round loop projected, plus ~15 s
    # of start-up), so 360 s; HierFAVG (also 100 local steps a round) alike. Each needs a call
    # of its own: `--only reproduce:sfedhp`, then `--only reproduce:hierfavg`.
    **{f"reproduce:{m}": BUDGET_TABLE1.get(m, 150) for m in REPRODUCE_METHODS},
    # issue 54: Fashion-MNIST's rows, sized as MNIST's (the same model, clients and rounds)
    **{f"reproduce-fmnist:{m}": BUDGET_TABLE1.get(m, 150) for m in FMNIST_METHODS},
    # issue 40c (a 470 s deadline: as many sweeps as it holds; the rest in a second call with
    # --only). Sized from sweep-lam's 68.9 s on an H200 (sFedHP: 100 local steps a round).
    **{f"sweep:{m}": 90 for m in SWEEP_METHODS},
    "sweep-graphs": 110,  # as sweep-lam
}
SMOKE_RUN = ["rounds=2", "eval_every=1", "algorithm.R=1", "algorithm.K=1"]

# (what, piece, key, target, "<=" or ">=") — the issue's must-shows
MUST_SHOW: list[tuple[str, str, str, float | None, str]] = [
    ("test_gpu.py passed (issue: 47 or more)", "tests", "passed", 47, ">="),
    ("test_gpu.py failed", "tests", "failed", 0, "<="),
    ("FedAvg DNN-100 10k s/round", "table:fedavg-dnn100-10k", "s_per_round", 0.02, "<="),
    (
        "FedAvg DNN-100 10k launches (<= 62,424/50)",
        "table:fedavg-dnn100-10k",
        "launches",
        1248,
        "<=",
    ),
    ("FedAvg DNN-100 10k ratio to roofline", "table:fedavg-dnn100-10k", "ratio", 3, "<="),
    ("sFedHP DNN-100 1k/50 edges s/round", "table:sfedhp-dnn100-1k", "s_per_round", 0.08, "<="),
    ("DNN-100 1k vs per-client loop", "table:dnn100-1k", "speedup", 20, ">="),
    ("cnn2 10 clients vs loop", "table:cnn2-10", "speedup", 1.5, ">="),
    ("VGG-11-BN 10 clients vs loop", "table:vgg11-bn-10", "speedup", 1.5, ">="),
    ("ResNet-18 10 clients vs loop", "table:resnet18-10", "speedup", 1.5, ">="),
    ("VGG-11-BN fp32 s/round", "table:vgg11-bn-10", "s_per_round", 3.5, "<="),
    ("ResNet-18 fp32 s/round", "table:resnet18-10", "s_per_round", 6.0, "<="),
    ("VGG-11-BN bf16 s/round", "bf16:vgg11-bn-10", "s_per_round", 1.5, "<="),
    ("ResNet-18 bf16 s/round", "bf16:resnet18-10", "s_per_round", 2.5, "<="),
    ("fedhp run device=cuda (250 rounds) seconds", "run", "seconds", 10, "<="),
    ("the same with engine.cuda_graphs=true, seconds", "run-graphs", "seconds", 10, "<="),
    ("  its keys that ran without a graph", "run-graphs", "fallbacks", 0, "<="),
    ("batched LSTM 20x256 vs per-client loop", "lstm", "speedup_20x256", 1.0, ">"),
    ("batched LSTM 100x16 vs per-client loop", "lstm", "speedup_100x16", 1.0, ">"),
    ("LEAF FedAvg round, 1 epoch + eval, seconds", "leaf-round", "round_s", None, ""),
    (
        "LEAF FedAvg full run (40 x 20 epochs), hours, upper bound",
        "leaf-round",
        "full_run_h",
        None,
        "",
    ),
    ("λ sweep, 15 runs: sequential / lockstep, one process", "sweep-lam", "speedup", 10, ">="),
    ("CUDA graph probe: eager / replayed θ subproblem", "graph-probe", "speedup", None, ""),
    ("CUDA graph probe: a round's θ steps replayed, s", "graph-probe", "round_s_graph", None, ""),
    ("CUDA graph probe: replay vs eager, max abs diff", "graph-probe", "max_abs_diff", None, ""),
    ("λ sweep: sequential batch seconds", "sweep-lam", "sequential_s", None, ""),
    ("λ sweep: lockstep batch seconds", "sweep-lam", "lockstep_s", None, ""),
    ("λ sweep: round loops, sequential / lockstep", "sweep-lam", "train_speedup", None, ""),
    ("λ sweep, CUDA graphs: sequential / lockstep", "sweep-graphs", "speedup", None, ""),
    (
        "λ sweep: sequential without graphs / lockstep with graphs",
        "sweep-graphs",
        "vs_plain",
        10,
        ">=",
    ),
    ("λ sweep, CUDA graphs: sequential batch seconds", "sweep-graphs", "sequential_s", None, ""),
    ("λ sweep, CUDA graphs: lockstep batch seconds", "sweep-graphs", "lockstep_s", None, ""),
]
for _m in SWEEP_METHODS:
    _piece = f"sweep:{_m}"
    MUST_SHOW += [
        (f"{_m} sweep, 15 runs: sequential / lockstep, one process", _piece, "speedup", None, ""),
        (f"{_m} sweep: round loops, sequential / lockstep", _piece, "train_speedup", None, ""),
        (f"{_m} sweep: lockstep batch seconds", _piece, "lockstep_s", None, ""),
    ]
for _piece, _m in [
    *((f"reproduce:{m}", m) for m in REPRODUCE_METHODS),
    *((f"reproduce-fmnist:{m}", f"FMNIST {m}") for m in FMNIST_METHODS),
]:
    MUST_SHOW += [
        (f"Table I {_m}: seconds (3 seeds, start-up included)", _piece, "method_s", None, ""),
        (f"Table I {_m}: a seed's round loop, seconds", _piece, "run_s", None, ""),
        (f"Table I {_m}: final accuracy % (GM, else PM)", _piece, "final_pct", None, ""),
    ]


@dataclass
class Piece:
    """One check's outcome: ``status`` ok / failed / timeout / skipped, its wall time and
    numbers."""

    name: str
    status: str
    seconds: float
    values: dict[str, float]
    note: str = ""


def piece_command(name: str, device: str, smoke: bool, out: Path) -> list[str]:
    """The subprocess that runs piece ``name``."""
    py = sys.executable
    if name == "tests":
        # -o addopts=: the project's own -q would make this -qq, which prints no counts
        return [
            py,
            "-m",
            "pytest",
            "-q",
            "-o",
            "addopts=",
            "-p",
            "no:cacheprovider",
            "tests/engine/test_gpu.py",
        ]
    if name == "lstm":
        sizes = ["--sizes", "2x8", "3x4", "--seq-len", "5", "--steps", "1", "--repeats", "1"]
        return [py, str(HERE / "bench_lstm.py"), "--device", device, *(sizes if smoke else [])]
    if name == "leaf-round":
        scale = ["--quick", "algorithm.local_steps=1"] if smoke else ["algorithm.local_epochs=1"]
        return [
            py,
            "-m",
            "fedhp.cli",
            "reproduce",
            "leaf-shakespeare",
            "--methods",
            "fedavg",
            "--rounds",
            "2",
            "--out",
            str(out),
            f"device={device}",
            "eval_every=1",
            *scale,
        ]
    if name in ("sweep-lam", "sweep-graphs") or name.startswith("sweep:"):
        sizes = ["--runs", "2", "--rounds", "1"] if smoke else []
        method = []
        if name == "sweep-graphs" and device == "cuda":
            method = ["--set", "engine.cuda_graphs=true"]
        if name.startswith("sweep:"):
            m = name.split(":", 1)[1]
            key, values = SWEEP_METHODS[m]
            method = ["--method", m, "--key", key, "--lams", values]
        return [
            py,
            str(HERE / "bench_sweep.py"),
            "--device",
            device,
            "--inprocess",
            *sizes,
            *method,
            "--json",
            str(out / "bench_sweep.json"),
        ]
    if name == "graph-probe":
        repeats = ["--repeats", "2"] if smoke else []
        return [py, str(HERE / "gpu_graph_probe.py"), "--device", device, *repeats]
    if name.startswith("reproduce"):  # reproduce:<method> (MNIST), reproduce-fmnist:<method>
        seeds = "2" if smoke else str(TABLE1_SEEDS)
        table1 = SMOKE_TABLE1 + ["--eval-every", "1"] if smoke else TABLE1
        if name.startswith("reproduce-fmnist:"):
            table1 = [("fmnist" if arg == "mnist" else arg) for arg in table1]
        return [
            py,
            "-m",
            "fedhp.cli",
            "reproduce",
            "sfedhp-table1",
            f"device={device}",
            *table1,
            "--seeds",
            seeds,
            "--methods",
            name.split(":", 1)[1],
            "--out",
            str(out),
        ]
    if name in ("run", "run-graphs"):
        extra = SMOKE_RUN if smoke else []
        if name == "run-graphs" and device == "cuda":
            extra = [*extra, "engine.cuda_graphs=true"]
        return [
            py,
            "-m",
            "fedhp.cli",
            "run",
            f"device={device}",
            "progress=false",
            "checkpoint_every=0",
            *extra,
            "--out",
            str(out),
        ]
    kind, row = name.split(":")
    precision = "bf16" if kind == "bf16" else "fp32"
    cmd = [
        py,
        str(HERE / "bench_engine.py"),
        "--device",
        device,
        "--precision",
        precision,
        "--rows",
        row,
        "--table",
        "--table-repeats",
        "2",
    ]
    return [*cmd, "--smoke"] if smoke else cmd


LINE_PREFIX = {"graph-probe": "graph-probe ", "sweep-lam": "bench sweep-inprocess "}
"""Pieces whose numbers are the ``key=value`` pairs of their lines that start so."""


def parse(name: str, output: str, out: Path) -> dict[str, float]:
    """The numbers of a piece's output: pytest's passed/failed/skipped counts, a device-table
    line's ``key=value`` numbers, the run's summary.json ``seconds``."""
    values: dict[str, float] = {}
    if name == "tests":
        for count, what in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", output):
            values["failed" if what.startswith("error") else what] = float(count)
        values.setdefault("failed", 0.0)
        return values
    if name == "lstm":
        for line in output.splitlines():
            if line.startswith("bench lstm "):
                kv = dict(re.findall(r"(\w+)=([-+0-9.e]+|nan)(?:\s|$)", line))
                values[f"speedup_{kv['clients']}x{kv['hidden']}"] = float(kv["speedup"])
        return values
    if name == "leaf-round":
        timings = out / "runs" / "fedavg" / "seed0" / "timings.csv"
        if timings.exists():
            seconds = [float(r.split(",")[1]) for r in timings.read_text().splitlines()[1:]]
            if len(seconds) >= 2:
                values["round_s"] = seconds[-1] - seconds[-2]
                values["full_run_h"] = LEAF_ROUNDS * LEAF_EPOCHS * values["round_s"] / 3600
        return values
    sweep = name == "sweep-graphs" or name.startswith("sweep:")
    prefix = LINE_PREFIX.get("sweep-lam" if sweep else name)
    if prefix is not None:
        for line in output.splitlines():
            if line.startswith(prefix):
                for key, value in re.findall(r"(\w+)=([-+0-9.e]+)(?:\s|$)", line):
                    values[key] = float(value)
        return values
    if name.startswith("reproduce"):
        return parse_table1(out)
    if name in ("run", "run-graphs"):
        summary = out / "summary.json"
        if summary.exists():
            values["seconds"] = float(json.loads(summary.read_text())["seconds"])
        if name == "run-graphs":
            values["fallbacks"] = float(output.count("engine.cuda_graphs:"))
        return values
    for line in output.splitlines():
        if line.startswith("device ") and " failed: " not in line:
            for key, value in re.findall(r"(\w+)=([-+0-9.e]+)(?:\s|$)", line):
                values[key] = float(value)
    return values


def parse_table1(out: Path) -> dict[str, float]:
    """A ``reproduce:<method>`` piece's numbers: from its table.json a seed's round loop
    (``run_s``, the mean summary.json ``seconds``) and the final accuracy in % (``final_pct``:
    the global model's, else the personalized one's); from its runs' timings.csv the rounds
    the slowest seed reached (``rounds_done``) and, projected to every round, its seconds
    (``projected_run_s``; what a cut-off piece still tells)."""
    values: dict[str, float] = {}
    table = out / "table.json"
    if table.exists():
        data = json.loads(table.read_text())
        row = data["rows"][0] if data.get("rows") else {}
        seconds = row.get("seconds")
        if isinstance(seconds, dict):
            values["run_s"] = float(seconds["mean"])
        for key in ("final_global_acc", "final_personal_acc"):
            acc = row.get(key)
            if isinstance(acc, dict):
                values["final_pct"] = 100 * float(acc["mean"])
                break
    reached: list[tuple[int, float]] = []
    for timings in sorted((out / "runs").glob("*/seed*/timings.csv")):
        rows = timings.read_text().splitlines()[1:]
        if rows:
            last = rows[-1].split(",")
            reached.append((int(last[0]), float(last[1])))
    config = next(iter(sorted((out / "runs").glob("*/seed*/config.yaml"))), None)
    if reached:
        done, seconds = min(reached)
        values["rounds_done"] = float(done)
        total = _rounds_of(config) if config is not None else None
        if total and done:
            values["projected_run_s"] = seconds * total / done
    return values


def _rounds_of(config: Path) -> int | None:
    """A run's ``rounds`` from its config.yaml (without a YAML parser: the GPU host's
    interpreter may lack one)."""
    match = re.search(r"^rounds: (\d+)$", config.read_text(), re.MULTILINE)
    return int(match.group(1)) if match else None


KEEP_SUFFIXES = (".md", ".json", ".csv", ".log", ".yaml", ".txt")
KEEP_MAX_BYTES = 2_000_000


def keep_results(name: str, out: Path, keep: Path) -> None:
    """Copy piece ``name``'s small result files (tables, summaries, metrics, logs) from
    ``out`` into ``keep/<name>`` (``:`` written ``-``)."""
    if not out.is_dir():
        return
    dest = keep / name.replace(":", "-")
    for path in sorted(out.rglob("*")):
        small = path.is_file() and path.stat().st_size <= KEEP_MAX_BYTES
        if small and path.suffix in KEEP_SUFFIXES:
            target = dest / path.relative_to(out)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def run_piece(
    name: str, device: str, smoke: bool, budget: float, keep: Path | None = None
) -> Piece:
    """Run one piece in a subprocess cut off after ``budget`` seconds."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "src"), str(HERE), os.environ.get("PYTHONPATH", "")]
        ),
    }
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = piece_command(name, device, smoke, out)
        start = time.perf_counter()
        try:
            done = subprocess.run(
                cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=budget, check=False
            )
            stdout, stderr, code = done.stdout, done.stderr, done.returncode
        except subprocess.TimeoutExpired as cut:  # keep what it printed before the cut
            stdout, stderr, code = _text(cut.stdout), _text(cut.stderr), None
        wall = time.perf_counter() - start
        values = parse(name, stdout + stderr, out)
        if name.startswith("reproduce") and code == 0:
            values["method_s"] = wall
        if keep is not None:
            keep_results(name, out, keep)
            log = keep / name.replace(":", "-") / "piece.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(stdout + stderr)
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    print(f"## {name} ({wall:.1f} s, exit {'cut off' if code is None else code})", flush=True)
    for ln in lines[-12:]:
        print(f"   {ln}", flush=True)
    if code is None:
        note = f"> {budget:.0f} s"
        if "projected_run_s" in values:
            note += (
                f"; its runs reached round {values['rounds_done']:.0f}, "
                f"{values['projected_run_s']:.0f} s projected for a seed's round loop"
            )
        return Piece(name, "timeout", wall, values, note)
    failed = code != 0 or " failed: " in stdout
    if name == "tests" and code == 5:  # pytest: nothing collected/all deselected
        failed = False
    tail = (stderr.strip().splitlines() or [""])[-1][:120] if failed else ""
    return Piece(name, "failed" if failed else "ok", wall, values, tail)


def _text(output: bytes | str | None) -> str:
    """A cut-off subprocess's partial output as text."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def verdict(value: float | None, target: float | None, op: str) -> str:
    """``yes`` / ``NO`` against the target; ``n/a`` unmeasured; ``measured`` without a target."""
    if value is None:
        return "n/a"
    if target is None:
        return "measured"
    ok = {"<=": value <= target, ">=": value >= target, ">": value > target}[op]
    return "yes" if ok else "NO"


def derive(pieces: dict[str, Piece]) -> None:
    """Numbers that take two pieces: the λ sweep's runs one by one as fedhp runs them by default
    (``sweep-lam``'s sequential batch, no graphs) against its lockstep batch with CUDA graphs
    (``sweep-graphs``), as ``vs_plain`` of ``sweep-graphs`` (same call, same machine)."""
    plain, graphs = pieces.get("sweep-lam"), pieces.get("sweep-graphs")
    if plain is None or graphs is None:
        return
    seq, lock = plain.values.get("sequential_s"), graphs.values.get("lockstep_s")
    if seq is not None and lock:
        graphs.values["vs_plain"] = seq / lock


def table(pieces: dict[str, Piece], issue: str | None = None) -> list[str]:
    """The final table: every piece's status and time, then the must-shows of ``issue``'s
    pieces and of the pieces that ran (None: of the issues whose pieces ran; those of their
    pieces that did not run: ``n/a``)."""
    if issue is not None:
        shown = set(ISSUE_PIECES[issue]) | set(pieces)
    else:
        shown = {n for names in ISSUE_PIECES.values() if set(names) & set(pieces) for n in names}
    rows = ["| piece | status | seconds | note |", "|---|---|---|---|"]
    rows += [f"| {p.name} | {p.status} | {p.seconds:.1f} | {p.note} |" for p in pieces.values()]
    rows += ["", "| must-show | measured | target | met |", "|---|---|---|---|"]
    for what, piece, key, target, op in MUST_SHOW:
        if piece not in shown:
            continue
        value = pieces[piece].values.get(key) if piece in pieces else None
        measured = "—" if value is None else f"{value:g}"
        wanted = "—" if target is None else f"{op} {target:g}"
        rows.append(f"| {what} | {measured} | {wanted} | {verdict(value, target, op)} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CPU check)")
    parser.add_argument(
        "--issue",
        choices=sorted(ISSUE_PIECES),
        default=None,
        help="whose checks (default 35, or the issue of the --only pieces)",
    )
    parser.add_argument(
        "--only", nargs="*", default=None, help="pieces to run (default: the issue's)"
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every time box")
    parser.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds for the whole script: a piece gets at most what is left (the last piece "
        "all of it, past its box), and is skipped when under 10 s is left (default: the "
        "issue's, --issue 40b: 470; none with --smoke)",
    )
    parser.add_argument(
        "--keep", type=Path, default=None, help="copy each piece's result files into this folder"
    )
    args = parser.parse_args(argv)
    issue = args.issue or next(
        (i for i, ns in ISSUE_PIECES.items() if args.only and set(args.only) <= set(ns)), "35"
    )
    names = args.only or ISSUE_PIECES[issue]
    unknown = [n for n in names if n not in BUDGET]
    if unknown:
        parser.error(f"unknown piece(s) {unknown}; choose from {list(BUDGET)}")
    deadline = args.deadline
    if deadline is None and not args.smoke:
        deadline = ISSUE_DEADLINE.get(issue)
    start = time.perf_counter()
    pieces: dict[str, Piece] = {}
    for name in names:
        budget = BUDGET[name] * args.scale
        if deadline is not None:
            left = deadline - (time.perf_counter() - start)
            # the last piece takes what is left (its box only protects the pieces after it)
            budget = left if name == names[-1] else min(budget, left)
        if budget < 10:
            pieces[name] = Piece(name, "skipped", 0.0, {}, "deadline reached")
            continue
        pieces[name] = run_piece(name, args.device, args.smoke, budget, args.keep)
    derive(pieces)
    print(
        f"# gpu_check: device={args.device} smoke={args.smoke} "
        f"total={time.perf_counter() - start:.1f} s",
        flush=True,
    )
    for row in table(pieces, issue):
        print(row, flush=True)
    return 0 if all(p.status == "ok" for p in pieces.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
