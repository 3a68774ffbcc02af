"""FGRPO's ``flower`` backend: the federated loop as a Flower ServerApp, the clients as a Flower ClientApp, on a
local simulated federation of ``len(driver.clients)`` SuperNodes (``pip install 'groupwise[federated]'``).

The ServerApp's main runs ``fgrpo.Loop`` (the same rounds, aggregation, eval and checkpoints as the in-process
backend) over ``FlowerFederation``, which talks to the clients only through Flower messages:

  query     ``op=hello`` → the node's ``partition-id`` (client k); ``op=get_state`` / ``op=set_state``: the
            client's optimizer, scheduler and component state as bytes (``torch.save``), for checkpoints and resume
  train     the global trainable weights (ArrayRecord) and the round → the delta (ArrayRecord), the score and the
            mean step metrics (MetricRecord); a ClientApp that raises comes back as an error reply, which the
            server counts as a failed client for that round
  evaluate  the global weights → the client's held-out eval metrics

A ClientApp keeps its ``fgrpo.Client`` (its pipeline, built once) in this module's per-process cache, keyed by
run directory and partition: the simulation gets one CPU and one actor, so every client lives in that actor's
process for the whole run, and results equal the in-process backend's (tested). The federation is started with
``flwr.simulation.run_simulation`` (Ray backend) from inside the driver, so that ``groupwise train`` keeps its run
directory, resume and signals; Flower marks that entry point deprecated in favour of ``flwr run``, which needs a
Flower app project and a SuperLink: a later move. Flower's telemetry is switched off
(``FLWR_TELEMETRY_ENABLED=0``) unless the environment sets it.
"""

from __future__ import annotations

import io
import os
import threading
import time
from typing import Any

import torch

from groupwise.drivers import fgrpo

_CLIENTS: dict[tuple[str, int], fgrpo.Client] = {}
_LOCK = threading.Lock()


def _require():
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise RuntimeError("driver.backend=flower needs flwr, which is not installed: pip install "
                           "'groupwise[federated]'") from None


def to_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def from_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def cached_client(k: int, run, cfg, model_path: str | None) -> fgrpo.Client:
    """Client k of this run, built on first use in this process (a module-level function, so that the
    ClientApp's handlers pickle it by reference into the simulation's actors, without the lock)."""
    torch.set_num_threads(run.trainer.threads or 1)
    with _LOCK:
        key = (str(run.run_dir), k)
        if key not in _CLIENTS:
            from groupwise import plugins

            for ref in run.plugins:  # a simulation actor is a fresh process: the run's plug-ins register here too
                plugins.import_ref(ref)
            _CLIENTS[key] = fgrpo.Client(run, cfg, k, model_path)
        return _CLIENTS[key]


def client_app(run, cfg, model_path: str | None):
    """The ClientApp: each handler finds (or builds) client ``partition-id``'s ``fgrpo.Client``."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    def client(ctx: Context) -> fgrpo.Client:
        return cached_client(int(ctx.node_config["partition-id"]), run, cfg, model_path)

    @app.query()
    def query(msg: Message, ctx: Context) -> Message:
        c, conf = client(ctx), msg.content["config"]
        out: dict[str, Any] = {"partition": c.k}
        if conf["op"] == "get_state":
            out["state"] = to_bytes(c.state_dict())
        elif conf["op"] == "set_state":
            c.load_state_dict(from_bytes(conf["state"]))
        return Message(RecordDict({"config": ConfigRecord(out)}), reply_to=msg)

    @app.train()
    def train(msg: Message, ctx: Context) -> Message:
        c = client(ctx)
        weights = dict(msg.content["arrays"].to_torch_state_dict())
        r = c.train(weights, int(msg.content["config"]["round"]))
        metrics = MetricRecord({**{k: float(v) for k, v in r.metrics.items()}, "fgrpo/score": float(r.score)})
        return Message(RecordDict({"arrays": ArrayRecord(r.delta), "metrics": metrics}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, ctx: Context) -> Message:
        m = client(ctx).evaluate(dict(msg.content["arrays"].to_torch_state_dict()))
        return Message(RecordDict({"metrics": MetricRecord({k: float(v) for k, v in m.items()})}), reply_to=msg)

    return app


class FlowerFederation:
    """``fgrpo.InProcess``'s interface over a Flower ``Grid``: each call is one message to every client."""

    def __init__(self, grid, n: int, timeout_s: float = 120.0):
        self.grid, self.n = grid, n
        deadline = time.monotonic() + timeout_s
        nodes: list[int] = []
        while len(nodes) < n:  # the simulated SuperNodes register asynchronously
            if time.monotonic() > deadline:
                raise RuntimeError(f"flower: {len(nodes)} of {n} SuperNodes registered within {timeout_s:.0f}s")
            time.sleep(0.1)
            nodes = list(grid.get_node_ids())
        replies = self.send({node: self.config(op="hello") for node in nodes}, "query")
        failed = [r.error.reason for r in replies.values() if r.has_error()]
        if failed:
            raise RuntimeError(f"flower: a client could not start: {failed[0]}")
        self.node = {int(r.content["config"]["partition"]): node for node, r in replies.items()}

    @staticmethod
    def config(**kw):
        from flwr.app import ConfigRecord, RecordDict

        return RecordDict({"config": ConfigRecord(kw)})

    def send(self, contents: dict[int, Any], kind: str) -> dict[int, Any]:
        """One message per node; replies by node, in the nodes' order."""
        from flwr.app import Message

        msgs = [Message(content, dst_node_id=node, message_type=kind) for node, content in contents.items()]
        by_node = {r.metadata.src_node_id: r for r in self.grid.send_and_receive(msgs)}
        return {node: by_node[node] for node in contents if node in by_node}

    def train(self, weights: fgrpo.Weights, rnd: int) -> dict[int, fgrpo.ClientResult | BaseException]:
        from flwr.app import ArrayRecord, ConfigRecord, RecordDict

        content = RecordDict({"arrays": ArrayRecord(weights), "config": ConfigRecord({"round": rnd})})
        replies = self.send({self.node[k]: content for k in range(self.n)}, "train")
        out: dict[int, fgrpo.ClientResult | BaseException] = {}
        for k in range(self.n):
            r = replies.get(self.node[k])
            if r is None or r.has_error():
                out[k] = RuntimeError(f"client {k}: " + (r.error.reason if r is not None else "no reply"))
                continue
            m = dict(r.content["metrics"])
            score = m.pop("fgrpo/score")
            out[k] = fgrpo.ClientResult(dict(r.content["arrays"].to_torch_state_dict()), score, m)
        return out

    def evaluate(self, weights: fgrpo.Weights) -> dict[int, dict[str, float]]:
        from flwr.app import ArrayRecord, RecordDict

        replies = self.send({self.node[k]: RecordDict({"arrays": ArrayRecord(weights)}) for k in range(self.n)},
                            "evaluate")
        return {k: dict(replies[self.node[k]].content["metrics"]) for k in range(self.n)}

    def states(self) -> list[dict[str, Any]]:
        replies = self.send({self.node[k]: self.config(op="get_state") for k in range(self.n)}, "query")
        return [from_bytes(replies[self.node[k]].content["config"]["state"]) for k in range(self.n)]

    def load_states(self, states: list[dict[str, Any]]) -> None:
        self.send({self.node[k]: self.config(op="set_state", state=to_bytes(s)) for k, s in enumerate(states)},
                  "query")


def run(loop: fgrpo.Loop, states: list | None, model_path: str | None) -> dict[str, dict[str, float]]:
    """Run ``loop`` as a ServerApp over a simulated federation (one Ray CPU, one client actor)."""
    _require()
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    n, holder = len(loop.cfg.clients), {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, ctx: Context) -> None:
        try:
            fed = FlowerFederation(grid, n)
            if states is not None:
                fed.load_states(states)
            holder["result"] = loop(fed)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller, after the simulation shut down
            holder["error"] = e

    run_simulation(server, client_app(loop.run, loop.cfg, model_path), num_supernodes=n,
                   backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 1}})
    if "error" in holder:
        raise holder["error"]
    if "result" not in holder:
        raise RuntimeError("flower: the ServerApp ended without a result (see the log above)")
    return holder["result"]
