"""The fedhp ServerApp, ``fedhp.flower.server_app:app``: the cloud.

Run config keys (Flower's ``[tool.flwr.app.config]`` / ``flwr run --run-config``):

``fedhp-config``  the full resolved fedhp configuration as a YAML string (required)
``fedhp-out``     the run folder; results are written there (required)
``fedhp-resume``  true: continue the run in ``fedhp-out`` from its checkpoint (optional)

Nothing else is needed. The ServerApp waits for ``flower.nodes`` SuperNodes, assigns shard ``i``
to the ``i``-th node id in sorted order, and runs the usual fedhp round loop
(:func:`fedhp.engine.runner.run_experiment`) with the rounds executed over Flower
(:class:`fedhp.flower.cloud.FlowerDriver`). The cloud loads the dataset too, to evaluate the global
model with the same code as the in-process engine; personalized models held on nodes are
evaluated there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedhp.build import build_experiment
from fedhp.config import RunConfig, validate_config
from fedhp.engine.experiment import Experiment
from fedhp.engine.runner import Row, run_experiment
from fedhp.errors import FedhpError
from fedhp.flower.cloud import FlowerDriver, Reply, log_line
from fedhp.flower.shards import check_flower_config, make_shards, node_count

CONFIG_KEY = "fedhp-config"
OUT_KEY = "fedhp-out"
RESUME_KEY = "fedhp-resume"
NODE_WAIT_POLL_S = 0.5
PULL_INTERVAL_S = 0.05


class GridTransport:
    """Sends through Flower's :class:`~flwr.serverapp.Grid`: one message per node, then pulls the
    replies until all are in or ``flower.timeout`` seconds have passed (as
    ``Grid.send_and_receive`` does), giving up early once ``stop`` is set (the simulation
    runtime ended)."""

    def __init__(
        self,
        grid: Grid,
        node_of_shard: dict[int, int],
        timeout: float,
        stop: threading.Event | None = None,
    ) -> None:
        self.grid = grid
        self.node_of_shard = node_of_shard
        self.timeout = timeout
        self.stop = stop

    def _check_stop(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise FedhpError("the Flower simulation runtime stopped; ending the run")

    def exchange(self, kind: str, rnd: int, requests: dict[int, RecordDict]) -> dict[int, Reply]:
        self._check_stop()
        shards = list(requests)
        messages = [
            Message(requests[shard], self.node_of_shard[shard], kind, group_id=str(rnd))
            for shard in shards
        ]
        # Replies are matched to the message they answer (the SuperLink itself answers for a
        # node it knows is gone); a message Flower could not push (id None) gets no reply.
        pushed = list(self.grid.push_messages(messages))
        shard_of_message = {mid: s for mid, s in zip(pushed, shards, strict=True) if mid}
        pending = set(shard_of_message)
        deadline = time.monotonic() + self.timeout
        replies: list[Message] = []
        while pending:
            got = list(self.grid.pull_messages(pending))
            replies.extend(got)
            pending.difference_update(r.metadata.reply_to_message_id for r in got)
            if not pending or time.monotonic() >= deadline:
                break
            self._check_stop()
            time.sleep(PULL_INTERVAL_S)
        out: dict[int, Reply] = {}
        for reply in replies:
            shard = shard_of_message.get(reply.metadata.reply_to_message_id)
            if shard is None:
                continue
            if reply.has_error():
                out[shard] = f"{reply.error.code}: {reply.error.reason}"
            else:
                out[shard] = reply.content
        return out


def wait_for_nodes(
    grid: Grid, count: int, timeout: float, stop: threading.Event | None = None
) -> list[int]:
    """The ``count`` lowest node ids once at least ``count`` nodes are connected."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= count:
            return nodes[:count]
        if time.monotonic() > deadline or (stop is not None and stop.is_set()):
            raise FedhpError(
                f"flower.nodes: {count} nodes needed but {len(nodes)} connected after "
                f"{timeout:g}s; start more SuperNodes or lower flower.nodes"
            )
        time.sleep(NODE_WAIT_POLL_S)


def serve(
    grid: Grid,
    exp: Experiment,
    out_dir: Path | None,
    progress: bool | None = None,
    stop: threading.Event | None = None,
    resume: bool = False,
    on_round: Callable[[int], None] | None = None,
) -> tuple[Row, FlowerDriver]:
    """Run ``exp`` with its rounds executed on the grid's nodes; returns the summary and the
    driver. ``stop``: set when the runtime is gone (the simulation launcher's), ends the run.
    ``resume``: continue from ``out_dir``'s checkpoint (the nodes get their rows of it).
    ``on_round(rounds_done)``: called after every finished round."""
    cfg = exp.cfg
    hierarchical = exp.options.hierarchical
    check_flower_config(cfg, exp.options)
    nodes = node_count(cfg, hierarchical)
    shards = make_shards(exp.ctx.topology, nodes, hierarchical)
    node_ids = wait_for_nodes(grid, nodes, cfg.flower.timeout, stop)
    transport = GridTransport(grid, dict(enumerate(node_ids)), cfg.flower.timeout, stop)
    log_line(f"flower: {nodes} nodes, shards of {[len(s.clients) for s in shards]} clients")
    driver = FlowerDriver(exp, transport, shards, out_dir)
    summary = run_experiment(
        exp, out_dir, progress=progress, resume=resume, driver=driver, on_round=on_round
    )
    return summary, driver


def config_from_run_config(run_config: dict[str, Any]) -> tuple[RunConfig, Path, bool]:
    """The fedhp configuration, run folder and whether to resume, from Flower's run config."""
    text, out = run_config.get(CONFIG_KEY), run_config.get(OUT_KEY)
    if not isinstance(text, str) or not isinstance(out, str):
        raise FedhpError(
            f"run config: {CONFIG_KEY!r} (fedhp YAML) and {OUT_KEY!r} (results folder) are "
            'required; e.g. flwr run . --run-config \'fedhp-config="..." fedhp-out="runs/x"\''
        )
    resume = run_config.get(RESUME_KEY, False)
    if not isinstance(resume, bool):
        raise FedhpError(f"run config: {RESUME_KEY!r} must be true or false, not {resume!r}")
    return validate_config(yaml.safe_load(text)), Path(out), resume


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """``flwr run`` entry: build the experiment from the run config and serve it."""
    cfg, out, resume = config_from_run_config(dict(context.run_config))
    serve(grid, build_experiment(cfg), out, resume=resume)


def make_server_app(
    exp: Experiment,
    out_dir: Path | None,
    result: dict[str, Any],
    progress: bool | None = None,
    stop: threading.Event | None = None,
    resume: bool = False,
    on_round: Callable[[int], None] | None = None,
) -> ServerApp:
    """A ServerApp serving an already built experiment (the simulation launcher's); the summary
    and driver land in ``result``."""
    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        result["summary"], result["driver"] = serve(
            grid, exp, out_dir, progress, stop, resume, on_round
        )

    return server


__all__ = ["CONFIG_KEY", "OUT_KEY", "app", "make_server_app", "serve"]
