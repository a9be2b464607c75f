"""``dataset.split`` (positional / leaf / fedprox), ``dataset.min_lines`` (LEAF's filter of roles
with ≤ 2 lines), the splits' default training fractions, bad values, and the statistics report —
on tiny fabricated plays (random words, so every window occurs once in its role's text)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedhp.data import DATASETS, shakespeare
from fedhp.data.shakespeare import (
    LEAKY_SPLITS,
    ShakespeareSource,
    build_clients,
    decode,
    load_corpus,
    num_train_windows,
    split_windows,
)
from fedhp.data.shakespeare_cli import main
from fedhp.errors import ConfigError, DatasetError
from tests.data.shakespeare_play import positions

SEQ = 8


def located(
    folder: Path, split: str, **opts: object
) -> list[tuple[str, int, list[int], list[int]]]:
    """Per client: name, windows of its role, training and test window positions."""
    src = ShakespeareSource.model_validate(
        {"data_dir": str(folder), "seq_len": SEQ, "split": split, **opts}
    )
    data, names = src.load_with_names()
    assert data.train_owner is not None and data.test_owner is not None
    corpus = load_corpus(folder)
    out = []
    for cid, name in enumerate(names):
        play, role = name.split(":")
        r = next(
            i
            for i, n in enumerate(corpus.names)
            if n == role and corpus.plays[corpus.play_of[i]] == play
        )
        text = decode(corpus.role_codes(r))
        mine, theirs = data.train_owner == cid, data.test_owner == cid
        train = positions(text, data.train_x[mine], data.train_y[mine])
        test = positions(text, data.test_x[theirs], data.test_y[theirs])
        out.append((name, len(text) - SEQ, train, test))
    return out


def chars(starts: list[int]) -> set[int]:
    """Character positions covered by windows (inputs and targets) starting at ``starts``."""
    return {p for s in starts for p in range(s, s + SEQ + 1)}


def test_leaf_split_shares_exactly_one_character(plays: tuple[Path, dict]) -> None:
    """LEAF's split: the first int(0.9 n) windows train (its default --tf), test windows from
    num_train + seq_len − 1 (LEAF's num_train + 79 at 80 characters): the first test window's
    first character is the last training window's target, the only character shared."""
    clients = located(plays[0], "leaf")
    assert clients
    for _, n, train, test in clients:
        num_train = num_train_windows(n, 0.9)
        assert train == list(range(num_train))
        assert test == list(range(num_train + SEQ - 1, n))
        assert chars(train) & chars(test) == {num_train + SEQ - 1}


def test_positional_split_shares_nothing(plays: tuple[Path, dict]) -> None:
    """The default: test windows from num_train + seq_len, no character shared, nothing else
    thrown away (the gap is exactly the windows that would share one)."""
    for _, n, train, test in located(plays[0], "positional"):
        num_train = num_train_windows(n, 0.8)
        assert train == list(range(num_train))
        assert test == list(range(num_train + SEQ, n))
        assert not chars(train) & chars(test)
        assert max(chars(train)) + 1 == min(chars(test))


def test_fedprox_split_is_seeded_random_and_drops_no_role(plays: tuple[Path, dict]) -> None:
    """FedProx's split: every role with ≥ 2 windows is a client (even those the positional
    split drops), its windows are split at random with int(0.8 n) training ones and no gap
    (union = all windows), reproducibly for a seed and differently for another; test windows
    overlap training ones (the leak)."""
    folder = plays[0]
    corpus = load_corpus(folder)
    windows = np.maximum(corpus.lengths - SEQ, 0)
    roles = {
        f"{corpus.plays[corpus.play_of[r]]}:{corpus.names[r]}" for r in np.flatnonzero(windows >= 2)
    }
    first = located(folder, "fedprox")
    assert {name for name, *_ in first} == roles
    long = build_clients(corpus, 40, 0.8, 1.0, 0, 0, "fedprox")
    assert len(long) > len(build_clients(corpus, 40, 0.8, 1.0, 0, 0, "positional"))
    shuffled = False
    for _, n, train, test in first:
        assert len(train) == num_train_windows(n, 0.8) and test
        assert sorted(train + test) == list(range(n))  # disjoint, union = every window
        shuffled |= train != list(range(len(train)))
        assert chars(train) & chars(test)
    assert shuffled
    shakespeare._load.cache_clear()
    assert located(folder, "fedprox") == first
    other = located(folder, "fedprox", seed=1)
    assert [t for *_, t, _ in other] != [t for *_, t, _ in first]


def test_split_windows_counts() -> None:
    rng = np.random.default_rng(0)
    expect = {"positional": ([0], []), "leaf": ([0], [1])}  # LEAF: 2 windows → 1 trains
    for split, (train_at, test_at) in expect.items():
        train, test = split_windows(2, split, 0.8, 1, rng)
        assert (train.tolist(), test.tolist()) == (train_at, test_at)
    train, test = split_windows(2, "fedprox", 0.8, 1, rng)
    assert len(train) == len(test) == 1 and sorted([*train, *test]) == [0, 1]
    train, test = split_windows(1000, "fedprox", 0.8, 80, rng)
    assert len(train) == 800 and len(test) == 200 and not set(train) & set(test)
    train, test = split_windows(1000, "leaf", 0.9, 80, rng)
    assert (train[-1], test[0], len(test)) == (899, 900 + 79, 1000 - 979)
    with pytest.raises(ConfigError, match="^dataset.split: unknown split 'random'"):
        split_windows(10, "random", 0.8, 2, rng)


def test_min_lines_drops_short_roles_before_sampling(plays: tuple[Path, dict]) -> None:
    """LEAF drops roles with ≤ 2 text lines while building all_data: ``min_lines=3``. The
    fabricated plays' BOTH says one line (GAMMA one too, but has no window)."""
    folder, expected = plays
    corpus = load_corpus(folder)
    lines = {
        (corpus.plays[corpus.play_of[r]], corpus.names[r]): int(corpus.lines[r])
        for r in range(len(corpus.names))
    }
    for play, roles in expected.items():
        assert lines[(play, "BOTH")] == 1 and lines[(play, "GAMMA")] == 1
        assert lines[(play, "ALPHA")] == 2 * len(roles["ALPHA"])  # two lines per speech
    src = {"data_dir": str(folder), "seq_len": SEQ}
    _, every = ShakespeareSource.model_validate(src).load_with_names()
    _, kept = ShakespeareSource.model_validate({**src, "min_lines": 3}).load_with_names()
    assert {n.split(":")[1] for n in every} == {"ALPHA", "BETA", "BOTH"}
    assert kept == tuple(n for n in every if not n.endswith(":BOTH"))
    # before sampling: the filtered roles' windows are not part of --sf's total either
    windows = np.maximum(corpus.lengths - SEQ, 0)
    total = int(windows[corpus.lines >= 3].sum())
    part = build_clients(corpus, SEQ, 0.8, 0.5, 0, 0, "fedprox", min_lines=3)
    assert sum(len(c.train) + len(c.test) for c in part) == int(0.5 * total)
    assert all(corpus.lines[c.role] >= 3 for c in part)
    with pytest.raises(DatasetError, match="min_lines=99"):
        ShakespeareSource.model_validate({**src, "min_lines": 99}).load()


def test_each_split_has_its_training_fraction_and_leak_mark() -> None:
    def source(**opts: object) -> ShakespeareSource:
        return ShakespeareSource.model_validate(opts)

    assert (source().tf, source(split="leaf").tf, source(split="fedprox").tf) == (0.8, 0.9, 0.8)
    assert source(split="leaf", train_fraction=0.8).tf == 0.8
    assert [source(split=s).leaky for s in ("positional", "leaf", "fedprox")] == [
        False,
        True,
        True,
    ]
    assert set(LEAKY_SPLITS) == {"leaf", "fedprox"}


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"split": "random"}, "dataset.split"),
        ({"split": "LEAF"}, "dataset.split"),
        ({"min_lines": -1}, "dataset.min_lines"),
        ({"min_lines": 2.5}, "dataset.min_lines"),
        ({"train_fraction": 1.0}, "dataset.train_fraction"),
        ({"train_fraction": 0}, "dataset.train_fraction"),
    ],
)
def test_bad_values_are_one_line_errors(options: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        DATASETS.build({"name": "shakespeare", **options}, "dataset")
    text = str(err.value)
    assert "\n" not in text and text.startswith(field), text


def test_report_writes_every_split_and_marks_the_leaky_ones(
    plays: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = tmp_path / "out" / "splits"
    assert main(["--report", str(prefix), "--data-dir", str(plays[0]), "--seeds", "2"]) == 0
    report = json.loads(Path(f"{prefix}.json").read_text())
    md = Path(f"{prefix}.md").read_text()
    assert md in capsys.readouterr().out
    rows = [r for r in report["rows"] if "split" in r]
    assert {(r["split"], r["sf"]) for r in rows} == {
        (s, sf) for s in ("positional", "leaf", "fedprox") for sf in (1.0, 0.2)
    }
    for r in rows:
        assert r["leaky"] == (r["split"] != "positional")
        assert (r["sf"] < 1.0) == ("over_seeds" in r)
        label_line = next(line for line in md.splitlines() if line.startswith(f"| {r['label']}"))
        assert ("⚠ leaky" in label_line) == r["leaky"]
    full = {r["split"]: r["stats"] for r in rows if r["sf"] == 1.0 and r["min_lines"] == 3}
    assert full["fedprox"]["samples"] == full["fedprox"]["train"] + full["fedprox"]["test"]
    assert report["published"]["fedprox_table1"]["clients"] == 143
    assert main(["--stats", "--data-dir", str(plays[0]), "--split", "fedprox"]) == 0
    assert "split fedprox" in capsys.readouterr().out


def test_reproduction_counts_and_names_its_split(plays: tuple[Path, dict]) -> None:
    """``fedhp reproduce leaf-shakespeare ... dataset.split=fedprox``: the clients are counted
    with the runs' split (FedProx's keeps roles the positional split drops) and the table says
    which split ran, the leaky one as a test leak."""
    from fedhp.experiments import leaf

    scale = leaf.Scale(1.0, 40, 4, 1, None, 2, 0.5, 4, 3, 1, None)
    folder = str(plays[0])
    extra = ["dataset.split=fedprox", "dataset.min_lines=3", "rounds=1"]
    assert leaf.dataset_choice(extra) == {"split": "fedprox", "min_lines": 3}
    # ALPHA, BETA and BOTH of 2 plays; BOTH (1 line) goes with min_lines 3, and with the
    # positional split (too short for a test window after the gap)
    assert leaf.federation_of(scale, folder, extra[:1]).clients == 6
    assert leaf.federation_of(scale, folder, extra).clients == 4
    assert leaf.federation_of(scale, folder, []).clients == 4
    assert "Split: fedprox ⚠ TEST LEAK" in leaf.split_text(extra)
    assert "roles with ≤ 2 lines dropped" in leaf.split_text(extra)
    assert leaf.split_text([]).startswith("Split: positional (leak-free")
    assert "dataset.speech_separator=space" in leaf.dataset_overrides(scale, None)


@pytest.mark.parametrize(
    ("override", "text"),
    [
        ("dataset.split=random", "dataset.split: Input should be 'positional', 'leaf' or"),
        ("dataset.min_lines=-3", "dataset.min_lines: Input should be greater than or equal to 0"),
        ("model.init=keras", "model.init: Input should be 'torch' or 'tf'"),
    ],
)
def test_bad_values_on_the_command_line(
    override: str, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fedhp run --check``: exit 2, one line naming the field."""
    from fedhp.cli import main as fedhp_main

    argv = ["run", "--check", "dataset.name=shakespeare", "model.name=lstm", override]
    assert fedhp_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and text in err and "Traceback" not in err, err
