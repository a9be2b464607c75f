"""The GPU check script and the device table run on the CPU at tiny sizes (``--smoke``), so they
do not rot between GPU sessions; the final table's parsing and time boxes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(autouse=True)
def _benchmarks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))


def test_device_table_rows_run_at_smoke_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    """The engine against the per-client loop (DNN-100 and a BatchNorm conv net at bf16) on the
    CPU: a row of numbers each, the engine's result the loop's (fp32: to float rounding)."""
    import bench_engine

    bench_engine.device_table(torch.device("cpu"), "fp32", ["dnn100-1k"], 1, smoke=True)
    bench_engine.device_table(torch.device("cpu"), "bf16", ["cnn2-10"], 1, smoke=True)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("device ")]
    assert len(lines) == 4 and not any("failed" in ln for ln in lines), lines
    fp32 = dict(kv.split("=") for ln in lines[:2] for kv in ln.split()[2:])
    assert float(fp32["max_param_diff"]) < 1e-5 and int(fp32["launches"]) > 0
    assert int(fp32["reference_launches"]) > int(fp32["launches"])  # the loop launches more
    assert float(fp32["roofline_s"]) > 0 and fp32["chunk"] == fp32["clients"] == "8"
    assert "precision=bf16" in lines[2] and lines[3].startswith("device cnn2-10 launches=")


def test_gpu_check_smoke_runs_a_piece_and_prints_the_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import gpu_check

    code = gpu_check.main(["--device", "cpu", "--smoke", "--only", "run", "--scale", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    row = next(ln for ln in out.splitlines() if ln.startswith("| fedhp run"))
    assert float(row.split("|")[2]) > 0  # summary.json's seconds
    assert out.strip().splitlines()[-1].startswith("| fedhp run")  # the table comes last


def test_a_slow_piece_is_cut_off_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpu_check

    monkeypatch.setitem(gpu_check.BUDGET, "run", 0.05)
    piece = gpu_check.run_piece("run", "cpu", True, 0.05)
    assert piece.status == "timeout" and piece.seconds < 5


def test_a_cut_off_piece_keeps_the_numbers_it_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row that printed its times and then outlasted its box (a slow launch profile): the
    times count, the piece is reported as cut off."""
    import gpu_check

    script = "print('device cnn2-10 s_per_round=0.4 speedup=3.9'); import time; time.sleep(60)"
    monkeypatch.setattr(gpu_check, "piece_command", lambda *a: [sys.executable, "-c", script])
    piece = gpu_check.run_piece("table:cnn2-10", "cpu", True, 3)
    assert piece.status == "timeout" and piece.values == {"s_per_round": 0.4, "speedup": 3.9}


def test_the_deadline_skips_what_it_leaves_no_time_for(capsys: pytest.CaptureFixture[str]) -> None:
    import gpu_check

    code = gpu_check.main(["--device", "cpu", "--smoke", "--only", "run", "--deadline", "5"])
    assert code == 1 and "| run | skipped | 0.0 | deadline reached |" in capsys.readouterr().out


def test_outputs_are_parsed_into_the_must_shows(tmp_path: Path) -> None:
    import gpu_check

    tests = gpu_check.parse("tests", "3 failed, 44 passed, 2 skipped in 9.1s", tmp_path)
    assert tests == {"failed": 3.0, "passed": 44.0, "skipped": 2.0}
    line = "device fedavg-dnn100-10k s_per_round=0.0150 launches=900 ratio=2.5 device=cuda"
    row = gpu_check.parse("table:fedavg-dnn100-10k", line, tmp_path)
    assert row == {"s_per_round": 0.015, "launches": 900.0, "ratio": 2.5}
    pieces = {
        "tests": gpu_check.Piece("tests", "ok", 1.0, tests),
        "table:fedavg-dnn100-10k": gpu_check.Piece("table:fedavg-dnn100-10k", "ok", 1.0, row),
    }
    text = "\n".join(gpu_check.table(pieces))
    assert "| test_gpu.py failed | 3 | <= 0 | NO |" in text
    assert "| FedAvg DNN-100 10k s/round | 0.015 | <= 0.02 | yes |" in text
    assert "| sFedHP DNN-100 1k/50 edges s/round | — | <= 0.08 | n/a |" in text
    assert sys.executable  # the pieces run under this interpreter


def test_issue_32_pieces_run_at_smoke_sizes_and_fill_their_rows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--issue 32``: the LSTM bench and the LEAF round run (on the CPU at tiny sizes) and the
    round's seconds reach the table; a failing piece would make ``main`` return 1."""
    import gpu_check

    code = gpu_check.main(["--device", "cpu", "--smoke", "--issue", "32", "--scale", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("bench lstm batched_s_per_step=") == 2
    row = next(ln for ln in out.splitlines() if ln.startswith("| LEAF FedAvg round"))
    assert float(row.split("|")[2]) > 0 and row.rstrip().endswith("measured |")


def test_lstm_bench_lines_are_parsed_per_size(tmp_path: Path) -> None:
    import gpu_check

    line = (
        "bench lstm batched_s_per_step=0.5 reference_s_per_step=1.0 speedup=2.00 clients=20 "
        "hidden=256 path=bmm fused_s_per_step=nan device=cuda"
    )
    values = gpu_check.parse("lstm", f"noise\n{line}\n", tmp_path)
    assert values == {"speedup_20x256": 2.0}
    rows = gpu_check.table({"lstm": gpu_check.Piece("lstm", "ok", 1.0, values)})
    assert "| batched LSTM 20x256 vs per-client loop | 2 | > 1 | yes |" in rows
    assert "| LEAF FedAvg round, 1 epoch + eval, seconds | — | — | n/a |" in rows
    assert not any("VGG" in r for r in rows)  # only the rows of the issue whose pieces ran


def test_issue_40_sweep_piece_runs_at_smoke_sizes_and_fills_its_rows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--issue 40``'s λ sweep piece (``bench_sweep.py --inprocess``, 2 runs of 1 round on the
    CPU): sequential and lockstep batch seconds and their ratio reach the table."""
    import gpu_check

    code = gpu_check.main(["--device", "cpu", "--smoke", "--only", "sweep-lam", "--scale", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    row = next(ln for ln in out.splitlines() if ln.startswith("| λ sweep, 15 runs"))
    assert float(row.split("|")[2]) > 0 and "| >= 10 |" in row
    assert "| λ sweep: lockstep batch seconds |" in out
    assert "| fedhp run device=cuda (250 rounds) seconds | — | <= 10 | n/a |" in out  # issue 40's
    assert "LSTM" not in out and "VGG" in out  # issue 40's must-shows only


def test_issue_40_graphs_run_piece_fills_its_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """``run-graphs`` (the default run with ``engine.cuda_graphs=true`` on a GPU; on the CPU the
    plain run, which refuses that option) fills its seconds and its count of graph fallbacks."""
    import gpu_check

    assert "engine.cuda_graphs=true" in gpu_check.piece_command("run-graphs", "cuda", False, Path())
    assert "engine.cuda_graphs=true" not in gpu_check.piece_command("run", "cuda", False, Path())
    code = gpu_check.main(["--device", "cpu", "--smoke", "--only", "run-graphs", "--scale", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    row = next(ln for ln in out.splitlines() if ln.startswith("| the same with engine.cuda"))
    assert float(row.split("|")[2]) > 0 and "| <= 10 |" in row
    assert "|   its keys that ran without a graph | 0 | <= 0 | yes |" in out


def test_issue_40b_table1_pieces_run_at_smoke_sizes_and_keep_their_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--issue 40b``: ``fedhp reproduce sfedhp-table1`` one method a piece (2 seeds × 2 rounds
    of DNN-100 on the CPU); each method's seconds and accuracy reach the table, and ``--keep``
    holds its table.json."""
    import gpu_check

    only = ["--only", "reproduce:sfedhp", "reproduce:local"]
    argv = ["--device", "cpu", "--smoke", *only, "--scale", "4", "--keep", str(tmp_path)]
    code = gpu_check.main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    for method in ("sfedhp", "local"):
        seconds = next(ln for ln in out.splitlines() if ln.startswith(f"| Table I {method}: sec"))
        assert float(seconds.split("|")[2]) > 0, seconds
        acc = next(ln for ln in out.splitlines() if ln.startswith(f"| Table I {method}: final"))
        assert 0 < float(acc.split("|")[2]) <= 100, acc
        assert (tmp_path / f"reproduce-{method}" / "table.json").is_file()
    assert "| Table I hierfavg: seconds (3 seeds, start-up included) | — | — | n/a |" in out


def test_table1_outputs_and_a_cut_off_method_are_parsed(tmp_path: Path) -> None:
    """A Table I piece's numbers from its table.json; a method cut off: the rounds its slowest
    seed reached and the round loop they project to."""
    import json

    import gpu_check

    for seed, (done, seconds) in enumerate([(300, 30.0), (200, 21.0)]):
        run = tmp_path / "runs" / "sfedhp" / f"seed{seed}"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text("seed: 0\nrounds: 800\neval_every: 10\n")
        (run / "timings.csv").write_text(f"round,seconds\n10,1.0\n{done},{seconds}\n")
    values = gpu_check.parse("reproduce:sfedhp", "", tmp_path)
    assert values == {"rounds_done": 200.0, "projected_run_s": 84.0}
    row = {"final_global_acc": {"mean": 0.9, "std": 0.0}, "seconds": {"mean": 80.0, "std": 1}}
    (tmp_path / "table.json").write_text(json.dumps({"rows": [row]}))
    values = gpu_check.parse("reproduce:sfedhp", "", tmp_path)
    assert values["run_s"] == 80.0 and values["final_pct"] == pytest.approx(90.0)
    local = {"final_personal_acc": {"mean": 0.5}, "seconds": {"mean": 1.0}}
    (tmp_path / "table.json").write_text(json.dumps({"rows": [local]}))
    assert gpu_check.parse("reproduce:local", "", tmp_path)["final_pct"] == pytest.approx(50.0)


def test_sweep_lines_are_parsed_and_a_cut_off_sequential_line_counts(tmp_path: Path) -> None:
    import gpu_check

    seq = "bench sweep-inprocess sequential_s=41.5 sequential_train_s=36 repeat=1"
    assert gpu_check.parse("sweep-lam", f"noise\n{seq}\n", tmp_path)["sequential_s"] == 41.5
    final = (
        "bench sweep-inprocess speedup=5.2 train_speedup=6 sequential_s=41.5 lockstep_s=7.98 "
        "runs=15 rounds=20 threads=1 repeats=1 torch=2.13.0+cu128 device=cuda"
    )
    values = gpu_check.parse("sweep-lam", f"{seq}\n{final}\n", tmp_path)
    assert values["speedup"] == 5.2 and values["lockstep_s"] == 7.98 and "torch" not in values
    rows = gpu_check.table({"sweep-lam": gpu_check.Piece("sweep-lam", "ok", 1.0, values)}, "40")
    assert "| λ sweep, 15 runs: sequential / lockstep, one process | 5.2 | >= 10 | NO |" in rows


def test_issue_40b_time_boxes_fit_its_deadline_and_call_a_fits_8_minutes() -> None:
    import gpu_check

    assert sum(gpu_check.BUDGET[p] for p in gpu_check.ISSUE_PIECES["40"]) <= 480
    assert gpu_check.ISSUE_DEADLINE["40b"] <= 480
    assert gpu_check.ISSUE_PIECES["40b"][:2] == ["reproduce:sfedhp", "reproduce:hierfavg"]


def test_the_last_piece_takes_all_the_deadline_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``--deadline``, every piece but the last is held to its own box; the last gets what
    is left (an H200 call of 2026-11-27 lost its last 50 rounds to the box of the only piece)."""
    import gpu_check

    boxes: dict[str, float] = {}

    def fake(name: str, device: str, smoke: bool, budget: float, keep: object = None) -> object:
        boxes[name] = budget
        return gpu_check.Piece(name, "ok", 0.0, {})

    monkeypatch.setattr(gpu_check, "run_piece", fake)
    gpu_check.main(["--only", "run", "reproduce:sfedhp", "--deadline", "1000"])
    assert boxes["run"] == gpu_check.BUDGET["run"]
    assert gpu_check.BUDGET["reproduce:sfedhp"] < boxes["reproduce:sfedhp"] <= 1000


def test_graph_probe_piece_runs_eager_on_the_cpu_and_its_line_is_parsed(tmp_path: Path) -> None:
    import gpu_check

    piece = gpu_check.run_piece("graph-probe", "cpu", True, 120)
    assert piece.status == "ok" and piece.values["eager_s"] > 0 and "speedup" not in piece.values
    line = "graph-probe device=cuda eager_s=0.02 graph_s=0.004 speedup=5 max_abs_diff=0 graph=ok"
    values = gpu_check.parse("graph-probe", line, tmp_path)
    assert values["speedup"] == 5 and values["max_abs_diff"] == 0


def test_issue_40c_sweeps_of_other_methods_run_at_smoke_sizes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--issue 40c``'s ``sweep:<method>`` pieces (``bench_sweep.py --inprocess --method M
    --key K --lams ...``, 2 runs of 1 round on the CPU): HierFAVG's lr sweep reaches its rows,
    and every piece has a time box inside the call's deadline."""
    import gpu_check

    argv = ["--device", "cpu", "--smoke", "--only", "sweep:hierfavg", "--scale", "4"]
    code = gpu_check.main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    row = next(ln for ln in out.splitlines() if ln.startswith("| hierfavg sweep, 15 runs"))
    assert float(row.split("|")[2]) > 0
    pieces = ["sweep-lam", "sweep-graphs", *(f"sweep:{m}" for m in gpu_check.SWEEP_METHODS)]
    assert gpu_check.ISSUE_PIECES["40c"] == pieces
    assert all(
        gpu_check.BUDGET[p] <= gpu_check.ISSUE_DEADLINE["40c"]
        for p in gpu_check.ISSUE_PIECES["40c"]
    )
    command = gpu_check.piece_command("sweep:perfedavg", "cuda", False, Path("out"))
    assert command[command.index("--key") + 1] == "algorithm.beta"


def test_issue_40c_graphs_sweep_sets_the_option_on_a_gpu_and_derives_the_cross_ratio() -> None:
    """``sweep-graphs``: the λ sweep with ``engine.cuda_graphs=true`` for every run on a GPU (on
    the CPU, which refuses that option, it is ``sweep-lam``'s command, run above); ``vs_plain``
    is ``sweep-lam``'s sequential seconds over ``sweep-graphs``' lockstep seconds, in the table."""
    import gpu_check

    command = gpu_check.piece_command("sweep-graphs", "cuda", False, Path("out"))
    assert command[command.index("--set") + 1] == "engine.cuda_graphs=true"
    assert "--set" not in gpu_check.piece_command("sweep-lam", "cuda", False, Path("out"))
    assert "--set" not in gpu_check.piece_command("sweep-graphs", "cpu", True, Path("out"))
    pieces = {
        "sweep-lam": gpu_check.Piece("sweep-lam", "ok", 1.0, {"sequential_s": 30.0}),
        "sweep-graphs": gpu_check.Piece("sweep-graphs", "ok", 1.0, {"lockstep_s": 2.5}),
    }
    gpu_check.derive(pieces)
    assert pieces["sweep-graphs"].values["vs_plain"] == 12.0
    rows = gpu_check.table(pieces, "40c")
    assert (
        "| λ sweep: sequential without graphs / lockstep with graphs | 12 | >= 10 | yes |" in rows
    )
    alone = {"sweep-graphs": gpu_check.Piece("sweep-graphs", "ok", 1.0, {"lockstep_s": 2.5})}
    gpu_check.derive(alone)  # (without sweep-lam: nothing to derive)
    assert "vs_plain" not in alone["sweep-graphs"].values


def test_the_fmnist_table1_pieces_run_fashion_mnist_at_the_paper_model(tmp_path: Path) -> None:
    """``--issue 54``: one piece per method of Table I's Fashion-MNIST rows, the command MNIST's
    (Call B's) with only the dataset changed."""
    import gpu_check

    assert gpu_check.ISSUE_PIECES["54"][0] == "reproduce-fmnist:sfedhp"
    mnist = gpu_check.piece_command("reproduce:fedavg", "cuda", False, tmp_path)
    fmnist = gpu_check.piece_command("reproduce-fmnist:fedavg", "cuda", False, tmp_path)
    changed = [(a, b) for a, b in zip(mnist, fmnist, strict=True) if a != b]
    assert changed == [("mnist", "fmnist")]
    assert "dnn-500-200" in fmnist and fmnist[fmnist.index("--rounds") + 1] == "800"
    assert gpu_check.BUDGET["reproduce-fmnist:sfedhp"] == gpu_check.BUDGET["reproduce:sfedhp"]
