"""``backend=flower-sim``: the run on Flower's simulation engine (Ray), in this process.

The ServerApp runs in a thread of this process with the experiment already built; the ClientApps
run in Ray actors, ``ray_cpus / num_cpus`` at a time, each a virtual SuperNode hosting one shard.
To scale out, start a Ray cluster (``ray start --head`` here, ``ray start --address=HEAD:6379`` on
the other machines) and set ``RAY_ADDRESS=HEAD:6379`` before ``fedhp run ... backend=flower-sim``
(see docs/flower.md).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedhp.engine.experiment import Experiment
from fedhp.engine.runner import Row
from fedhp.errors import FedhpError
from fedhp.flower.processes import Watchdog
from fedhp.flower.shards import check_flower_config, node_count

RAY_OBJECT_STORE_BYTES = 256 * 2**20


def backend_config(exp: Experiment) -> dict[str, Any]:
    """Flower's simulation backend config: small, CPU-only Ray resources."""
    fl = exp.cfg.flower
    init_args: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR}
    if "RAY_ADDRESS" not in os.environ:  # a local Ray: keep its own footprint small
        init_args["object_store_memory"] = RAY_OBJECT_STORE_BYTES
        if fl.ray_cpus is not None:
            init_args["num_cpus"] = fl.ray_cpus
    return {
        "client_resources": {"num_cpus": fl.num_cpus, "num_gpus": 0.0},
        "init_args": init_args,
    }


def run_flower_sim(
    exp: Experiment,
    out_dir: Path | None,
    progress: bool | None = None,
    resume: bool = False,
    on_round: Callable[[int], None] | None = None,
) -> Row:
    """Run ``exp`` on Flower's simulation engine; results in ``out_dir`` as in-process runs.
    ``resume``: continue from ``out_dir``'s checkpoint (which holds the nodes' state too);
    ``on_round(rounds_done)``: called after every finished round."""
    import warnings

    from flwr.simulation import run_simulation

    from fedhp.flower.client_app import app as client_app
    from fedhp.flower.server_app import make_server_app

    check_flower_config(exp.cfg, exp.options)
    result: dict[str, Any] = {}
    stop = threading.Event()
    server = make_server_app(exp, out_dir, result, progress, stop, resume, on_round)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.ERROR)  # Flower's INFO/deprecation chatter; errors still show
    # Ray and Flower install SIGINT/SIGTERM handlers in this process; put ours back afterwards.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    dog = Watchdog.start()  # the local Ray Flower starts ends with this process, however it ends
    try:
        with warnings.catch_warnings(), dog.marking():
            warnings.simplefilter("ignore")
            run_simulation(
                server_app=server,
                client_app=client_app,
                num_supernodes=node_count(exp.cfg, exp.options.hierarchical),
                backend_config=backend_config(exp),
            )
    except RuntimeError as err:  # the runtime (Ray) failed; fedhp's own errors pass through
        cause = " ".join(str(err.__cause__ or err).split())[:300]
        raise FedhpError(
            f"backend=flower-sim: Flower's simulation runtime failed ({cause}); see the log "
            "above (on an overloaded machine, retry or lower flower.ray_cpus)"
        ) from err
    finally:
        stop.set()  # a ServerApp thread still waiting on a crashed runtime ends
        dog.close()  # (and what of Ray outlived Flower's shutdown of it: Ray's agents)
        flwr_logger.setLevel(level)
        if threading.current_thread() is threading.main_thread():
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)
    if "summary" not in result:
        raise RuntimeError("the Flower simulation ended without a result (see the log above)")
    summary: Row = result["summary"]
    return summary
