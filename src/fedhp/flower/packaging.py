"""Packaging of a Flower app: the app project naming fedhp's ServerApp/ClientApp with the fedhp
configuration as its run config, and the SuperLink connection the ``flwr`` CLI reads."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

SERVERAPP = "fedhp.flower.server_app:app"
CLIENTAPP = "fedhp.flower.client_app:app"
CONNECTION = "fedhp"
ConfigValue = str | int | float | bool


def toml_value(value: ConfigValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def app_pyproject(config: Mapping[str, ConfigValue]) -> str:
    """The ``pyproject.toml`` of a Flower app project running fedhp's ServerApp/ClientApp."""
    import tomli_w

    doc = {
        "project": {
            "name": "fedhp-flower",
            "version": "0.1.0",
            "description": "fedhp on a Flower deployment",
            "license": "MIT",
            "dependencies": [],
        },
        "tool": {
            "flwr": {
                "app": {
                    "publisher": "fedhp",
                    "components": {"serverapp": SERVERAPP, "clientapp": CLIENTAPP},
                    "config": dict(config),
                }
            }
        },
    }
    return tomli_w.dumps(doc, multiline_strings=True)


def write_app(app_dir: Path, config: Mapping[str, ConfigValue]) -> Path:
    """Write a Flower app project into ``app_dir``."""
    app_dir.mkdir(parents=True, exist_ok=True)
    (app_dir / "pyproject.toml").write_text(app_pyproject(config))
    return app_dir


def write_connection(flwr_home: Path, address: str, ca_cert: Path) -> Path:
    """Write ``$FLWR_HOME/config.toml`` with one default SuperLink connection, ``fedhp``."""
    import tomli_w

    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    doc = {
        "superlink": {
            "default": CONNECTION,
            CONNECTION: {"address": address, "root-certificates": str(ca_cert.resolve())},
        }
    }
    path.write_text(tomli_w.dumps(doc))
    return path
