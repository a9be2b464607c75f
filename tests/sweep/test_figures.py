"""The sweep's and ``fedhp compare``'s figures (:mod:`fedhp.sweep.figures`, issue 55): PNG, PDF
and SVG (``--format``), a legend with short names on every panel, accuracy in % as the table
prints it, a band of exactly the table's spread, the caption line in table.md."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest
from matplotlib.collections import PolyCollection

from fedhp.cli import main
from fedhp.errors import ConfigError
from fedhp.reporting import paper_style, parse_formats, short_label, short_names, short_value
from fedhp.sweep.figures import curve, sweep_figure
from fedhp.sweep.report import _points, _Run, load_table, write_report

MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF-", "svg": b"<?xml"}
ACCS = {  # point -> seed -> global accuracy at rounds 5 and 10
    "algorithm.lam=15": {0: (0.50, 0.70), 1: (0.60, 0.74), 2: (0.55, 0.75)},
    "algorithm.lam=20": {0: (0.40, 0.60), 1: (0.42, 0.66), 2: (0.47, 0.62)},
}


def _sweep(folder: Path) -> dict[str, Any]:
    """A finished sweep folder of 2 points x 3 seeds with known accuracies; its manifest."""
    runs = []
    for point, seeds in ACCS.items():
        lam = int(point.rpartition("=")[2])
        for seed, accs in seeds.items():
            run = folder / "runs" / point / f"seed{seed}"
            run.mkdir(parents=True)
            lines = ["round,global_acc,personal_acc"]
            lines += [f"{r},{a!r},{a + 0.1!r}" for r, a in zip((5, 10), accs, strict=True)]
            (run / "metrics.csv").write_text("\n".join(lines) + "\n")
            summary = {
                "final_global_acc": accs[-1],
                "best_global_acc": max(accs),
                "best_global_acc_round": 10,
                "final_personal_acc": accs[-1] + 0.1,
                "best_personal_acc": max(accs) + 0.1,
                "best_personal_acc_round": 10,
                "seconds": 1.0,
            }
            (run / "summary.json").write_text(json.dumps(summary))
            runs.append(
                {
                    "point": point,
                    "values": {"algorithm.lam": lam},
                    "seed": seed,
                    "split": "test",
                    "out_dir": f"runs/{point}/seed{seed}",
                    "rounds": 10,
                }
            )
    return {
        "version": 1,
        "base": ["rounds=10"],
        "plugins": [],
        "grid": {"algorithm.lam": [15, 20]},
        "seeds": [0, 1, 2],
        "select": None,
        "metric": "final_global_acc",
        "runs": runs,
        "selected": None,
    }


def test_curve_averages_the_common_rounds(tmp_path: Path) -> None:
    def run(rows: list[dict[str, Any]]) -> _Run:
        return _Run({"out_dir": "x"}, tmp_path, {}, rows)

    a = run([{"round": 5, "global_acc": 0.5}, {"round": 10, "global_acc": 0.7}])
    b = run([{"round": 5, "global_acc": 0.7}])  # diverged after round 5
    c = run([{"round": 5, "personal_acc": 0.9}])  # has no global_acc: not counted
    xs, ys, ses = curve([a, b, c], "global_acc")
    assert xs == [5.0] and ys == pytest.approx([0.6]) and ses == pytest.approx([0.1])
    assert curve([c], "global_acc") == ([], [], [])


def test_every_format_is_written(tmp_path: Path) -> None:
    manifest = _sweep(tmp_path)
    written = write_report(tmp_path, manifest, ["png", "pdf", "svg"])
    assert [p.name for p in written] == [
        "table.md",
        "table.csv",
        "curves.png",
        "curves.pdf",
        "curves.svg",
    ]
    for kind, magic in MAGIC.items():
        data = (tmp_path / f"curves.{kind}").read_bytes()
        assert data.startswith(magic), kind
    # vector formats: the PDF embeds TrueType fonts (type 42), not Type 3
    pdf = (tmp_path / "curves.pdf").read_bytes()
    assert b"/Subtype /Type3" not in pdf
    assert b"/Subtype /TrueType" in pdf or b"/Subtype /CIDFontType2" in pdf
    # the same figure, the same bytes (no dates in the files)
    before = {k: (tmp_path / f"curves.{k}").read_bytes() for k in MAGIC}
    write_report(tmp_path, manifest, ["png", "pdf", "svg"])
    assert {k: (tmp_path / f"curves.{k}").read_bytes() for k in MAGIC} == before


def test_legends_units_and_band_are_the_tables(tmp_path: Path) -> None:
    """Every panel: a legend naming the points by their short names, the y axis in %, and per
    point the mean ± standard error over seeds — at the last round exactly the table's
    final accuracy mean ± se (computed here with statistics, not the report's code)."""
    manifest = _sweep(tmp_path)
    write_report(tmp_path, manifest)
    rows = {row["point"]: row for row in load_table(tmp_path)}
    points = _points(tmp_path, manifest, "test")
    with paper_style():
        fig = sweep_figure(points, "test", None)
    assert len(fig.axes) == 2  # global and personalized
    for ax, offset in zip(fig.axes, (0.0, 0.1), strict=True):
        legend = ax.get_legend()
        assert legend is not None
        assert [t.get_text() for t in legend.get_texts()] == [r"$\lambda$ = 15", r"$\lambda$ = 20"]
        assert legend.get_title().get_text() == "mean ± s.e., 3 seeds"
        assert ax.get_ylabel() == "test accuracy (%)"
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        for line, band, (point, seeds) in zip(ax.get_lines(), bands, ACCS.items(), strict=True):
            finals = [100 * (accs[-1] + offset) for accs in seeds.values()]
            mean = statistics.fmean(finals)
            se = statistics.stdev(finals) / math.sqrt(len(finals))
            assert line.get_ydata()[-1] == pytest.approx(mean)
            ys = band.get_paths()[0].vertices[:, 1]
            low, high = ys.min(), ys.max()
            first = [100 * (accs[0] + offset) for accs in seeds.values()]
            first_se = statistics.stdev(first) / math.sqrt(3)
            assert high == pytest.approx(max(mean + se, statistics.fmean(first) + first_se))
            assert low == pytest.approx(min(mean - se, statistics.fmean(first) - first_se))
            if offset == 0.0:  # the table's column for this panel
                row = rows[point]
                assert 100 * row["final_global_acc_mean"] == pytest.approx(mean)
                assert 100 * row["final_global_acc_se"] == pytest.approx(se)


def test_table_md_names_the_figures_spread(tmp_path: Path) -> None:
    write_report(tmp_path, _sweep(tmp_path))
    md = (tmp_path / "table.md").read_text()
    (line,) = [x for x in md.splitlines() if x.startswith("- figure")]
    assert "`curves.png`" in line and "± one standard error" in line
    assert "the table's spread" in line and "(%)" in line


def test_short_names_and_values() -> None:
    names = short_names(["algorithm.lam", "algorithm.mu", "algorithm.name", "model.hidden"])
    assert names == {
        "algorithm.lam": r"$\lambda$",
        "algorithm.mu": r"$\mu$",
        "algorithm.name": "",
        "model.hidden": "hidden",
    }
    values = {"algorithm.name": "fedprox", "algorithm.mu": 0.01, "model.hidden": [500, 200]}
    assert short_label(values, names) == r"fedprox, $\mu$ = 0.01, hidden = [500,200]"
    assert [short_value(v) for v in (15.0, 1e-5, True, "a$b")] == ["15", "1e-05", "true", "a$b"]
    assert short_label({"x.tag": "a$b"}, short_names(["x.tag"])) == r"tag = a\$b"
    # two keys that would read the same keep their whole key
    assert short_names(["algorithm.lr", "robust.lr"]) == {
        "algorithm.lr": "algorithm.lr",
        "robust.lr": "robust.lr",
    }


def test_parse_formats() -> None:
    assert parse_formats(None) == ["png"]
    assert parse_formats("svg,PDF,png,pdf") == ["png", "pdf", "svg"]
    for bad, message in (("jpg", "--format jpg: not a figure format"), ("pdf,", "--format")):
        with pytest.raises(ConfigError, match=message):
            parse_formats(bad)


FAST = [
    "progress=false",
    "threads=1",
    "model.name=mlr",
    "rounds=2",
    "checkpoint_every=0",
    "eval_train=false",
    "algorithm.name=fedavg",
    "algorithm.local_steps=1",
    "federation.num_clients=4",
    "federation.num_edges=2",
    "subsample.train=400",
    "subsample.test=200",
    "partition.train_per_class=8",
    "partition.test_per_class=4",
]


def test_compare_writes_every_format_in_percent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fedhp compare --format pdf,svg``: the figure in the --out format and both vector
    formats; the legend by short names with the seeds, its title the band's spread; the axis
    and the table in %."""
    from fedhp.compare import figure_lines, make_groups, read_run

    folders = []
    for lr, seed in ((0.05, 0), (0.05, 1), (0.1, 0)):
        folder = tmp_path / f"lr{lr}-s{seed}"
        assert main(["run", "--out", str(folder), *FAST, f"algorithm.lr={lr}", f"seed={seed}"]) == 0
        folders.append(folder)
    out = tmp_path / "fig.png"
    capsys.readouterr()
    assert main(["compare", *map(str, folders), "--out", str(out), "--format", "pdf,svg"]) == 0
    for kind, magic in MAGIC.items():
        assert (tmp_path / f"fig.{kind}").read_bytes().startswith(magic), kind
    printed = capsys.readouterr().out
    assert "final global_acc (%)" in printed and "fig.pdf" in printed
    lines = figure_lines(make_groups([read_run(f) for f in folders]), "global_acc", "round")
    assert [line.label for line in lines] == [r"$\eta$ = 0.05 (2 seeds)", r"$\eta$ = 0.1"]
    from fedhp.reporting import read_rows

    final = 100 * float(read_rows(folders[2] / "metrics.csv")[-1]["global_acc"])
    assert lines[1].y[-1] == pytest.approx(final)
    assert main(["compare", *map(str, folders), "--out", str(out), "--format", "eps"]) == 2
    assert "--format eps: not a figure format" in capsys.readouterr().err


def test_sweep_format_pdf_writes_a_vector_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fedhp sweep ... --format pdf`` writes curves.pdf (and curves.png, always)."""
    out = tmp_path / "sweep"
    argv = ["sweep", *FAST, "--grid", "algorithm.lr=0.05,0.1", "--out", str(out)]
    assert main([*argv, "--format", "pdf"]) == 0
    results = capsys.readouterr().out.strip().splitlines()[-1]
    assert "curves.png, curves.pdf, sweep.json" in results and "svg" not in results
    assert (out / "curves.pdf").read_bytes().startswith(MAGIC["pdf"])
    assert (out / "curves.png").read_bytes().startswith(MAGIC["png"])
    assert not (out / "curves.svg").exists()
    capsys.readouterr()
    assert main([*argv, "--format", "gif"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--format gif: not a figure format" in err


def test_a_yaml_section_and_the_api_take_format_too(tmp_path: Path) -> None:
    """``format:`` in a YAML file's ``sweep:`` section and ``fedhp.sweep(format=...)`` write the
    figures ``--format`` writes; a bad one is the same one-line error."""
    import fedhp

    cfg = tmp_path / "sweep.yaml"
    cfg.write_text("sweep:\n  grid: {algorithm.lr: [0.05]}\n  format: svg\n")
    overrides = [item.split("=", 1) for item in FAST if "=" in item]
    kwargs: dict[str, Any] = {
        key.replace(".", "__"): value for key, value in overrides if key != "progress"
    }
    kwargs["progress"] = False
    done = fedhp.sweep(cfg, out=tmp_path / "yaml", **kwargs)
    assert (done.out_dir / "curves.svg").is_file() and not (done.out_dir / "curves.pdf").exists()
    done = fedhp.sweep(grid={"algorithm.lr": [0.05]}, out=tmp_path / "api", format="pdf", **kwargs)
    assert (done.out_dir / "curves.pdf").is_file()
    with pytest.raises(ConfigError, match="gif"):
        fedhp.sweep(grid={"algorithm.lr": [0.05]}, out=tmp_path / "bad", format="gif", **kwargs)
