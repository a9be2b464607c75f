"""A tiny fabricated play in the Gutenberg per-play format, for the Shakespeare tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedhp.data.shakespeare import decode

FRONT = """THE TRAGEDY OF TESTING

by William Shakespeare

PERSONS REPRESENTED.

ALPHA, a king.
BETA, his fool.

SCENE: A room.


ACT I.

SCENE I. A room in the palace.

[Enter ALPHA and BETA.]

"""


def words(rng: np.random.Generator, n: int) -> str:
    """``n`` random lower-case words (so that windows of a few characters are unique)."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return " ".join("".join(rng.choice(letters, rng.integers(3, 8))) for _ in range(n))


def play_text(seed: int = 0, speeches: int = 6, per_speech: int = 12) -> tuple[str, dict]:
    """The play and the expected ``{ROLE: [speech, ...]}`` its parser must return.

    ALPHA and BETA alternate; one BETA speech is interrupted by a multi-line stage direction, one
    ALPHA speech starts inline with an aside (``ALPHA. [Aside.] ...``), a scene heading falls
    between speeches, BOTH speak one line, and GAMMA says one short line."""
    rng = np.random.default_rng(seed)
    expected: dict[str, list[str]] = {"ALPHA": [], "BETA": [], "BOTH": [], "GAMMA": []}
    out = [FRONT]
    for k in range(speeches):
        role = "ALPHA" if k % 2 == 0 else "BETA"
        first, second = words(rng, per_speech), words(rng, per_speech)
        if k == 1:  # a stage direction over two lines inside the speech
            out.append(f"{role}.\n{first}\n\n[Re-enter a GHOST, and\nexit again.]\n\n{second}\n\n")
        elif k == 2:  # the speaker's name and an aside on one line
            out.append(f"{role}. [Aside.] {first}\n{second}  [Kneels.]\n\n")
        else:
            out.append(f"{role}.\n{first}\n{second}\n\n")
        expected[role].append(f"{first} {second}")
        if k == 3:
            out.append("SCENE II. Another room.\n\n[Enter GAMMA.]\n\n")
    both, gamma = words(rng, 12), "Hi."
    out.append(f"BOTH.\n{both}\n\nGAMMA.\n{gamma}\n\n[Exeunt.]\n\nTHE END\n")
    expected["BOTH"].append(both)
    expected["GAMMA"].append(gamma)
    return "".join(out), expected


def write_plays(directory: Path, count: int = 2, **kwargs: int) -> dict[str, dict]:
    """``count`` plays ``play<i>_gut.txt`` (plus a poem and a First-Folio file that must be
    ignored) in ``directory``; returns each play's expected roles."""
    directory.mkdir(parents=True, exist_ok=True)
    expected = {}
    for i in range(count):
        text, roles = play_text(seed=i, **kwargs)
        (directory / f"play{i}_gut.txt").write_text(text)
        expected[f"play{i}"] = roles
    (directory / "sonnets_gut.txt").write_text("Shall I compare thee to a summer's day?\n")
    (directory / "play0_gut_f.txt").write_text(FRONT + "ALPHA.\nfolio spelling\n")
    return expected


def positions(text: str, x: torch.Tensor, y: torch.Tensor) -> list[int]:
    """Where each window (input + target) starts in ``text`` (each occurs exactly once)."""
    found = []
    for row, nxt in zip(x, y, strict=True):
        window = decode(row) + decode(nxt.reshape(1))
        assert text.count(window) == 1
        found.append(text.index(window))
    return found
