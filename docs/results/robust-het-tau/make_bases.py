"""Write base-<algorithm>-<attack>.yaml: the full grid's own config.yaml of the chosen cclip
configuration (validation, seed 0, 2 label shards) for each attack setting, and
base-<algorithm>-mean-none.yaml, the clean mean's attack-free one, in today's resolved
form (fedhp.config.config_to_dict: the options the run does not read dropped, as the snapshot's
`fedhp run` refuses them when set), and check that it resolves to the same run.

PYTHONPATH=/work/snap/src .venv/bin/python docs/results/robust-het-tau/make_bases.py
"""

from pathlib import Path

import yaml

from fedhp.config import config_to_dict, normalized_config, resolve_config

GRID = Path("runs/reproduce/robust-heterogeneity-mnist-full/runs")
HERE = Path(__file__).resolve().parent
CHOSEN = {"fedavg": "cclip-t1-s1-m0.9", "hierfavg": "cclip-t1-s1-m0-both"}
BASES = [
    (alg, folder, attack, f"base-{alg}-{attack}.yaml")
    for alg, folder in CHOSEN.items()
    for attack in ("none", "sign_flip", "alie", "ipm")
] + [  # the clean mean, attack-free (its validation seeds 1, 2)
    (alg, "mean-s1-m0", "none", f"base-{alg}-mean-none.yaml") for alg in CHOSEN
]

for alg, folder, attack, name in BASES:
    src = GRID / alg / "val" / "shards2" / folder / attack / "seed0" / "config.yaml"
    data = config_to_dict(resolve_config(src, refuse_unread=False))
    out = HERE / name
    text = yaml.safe_dump(data, sort_keys=False)
    if not out.is_file() or out.read_text() != text:
        out.write_text(text)
    again = config_to_dict(resolve_config(out))  # refuses unread keys: must pass
    assert again == data == normalized_config(yaml.safe_load(src.read_text())), (alg, attack)
    print(f"{out.name}  <-  {src}")
