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
import signal
import threading
import time
from typing import Any

from groupwise.drivers import federated as fgrpo
from groupwise.lazy import torch
from groupwise.registry import RunStopped

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


def content(reply) -> Any | None:
    """A reply's content, or None for a failed client: an error reply (the ClientApp raised, or its process
    died), a reply without content, or no reply within the round timeout (a hung client)."""
    return reply.content if reply is not None and not reply.has_error() and reply.has_content() else None


def restart_actors() -> int:
    """Kill the simulation's client actors (``ClientAppActor``); Ray restarts them (the pool asks for
    ``max_restarts=-1``), so the next message runs on a fresh process instead of queueing behind a hung call
    forever. Uses Ray's GCS actor table (``ray._private.state``: the public state API needs the dashboard, which
    the simulation does not start), of this job only. Returns how many were killed."""
    import ray
    from ray._private import state

    ctx = ray.get_runtime_context()  # this run's actors on this machine only (a pid means nothing elsewhere)
    killed, job, node = 0, ctx.get_job_id(), ctx.get_node_id()
    for info in state.actors().values():
        if (info["ActorClassName"].endswith("ClientAppActor") and info["State"] == "ALIVE" and info["Pid"]
                and info.get("JobID") == job and (info.get("Address") or {}).get("NodeID") == node):
            try:
                os.kill(info["Pid"], signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def reason(reply) -> str:
    if reply is None:
        return "no reply within driver.round_timeout_s"
    return reply.error.reason if reply.has_error() else "a reply without content"


class FlowerFederation:
    """``fgrpo.InProcess``'s interface over a Flower ``Grid``: each call is one message to every client.

    A client that fails (raises, its process dies, or it does not answer within ``timeout_s``: then the actor it
    holds is killed and Ray restarts it) is left out of that call: a failed round for it (counted by the
    server), a missing entry in that eval (``eval/clients`` says how many answered), and its last state received
    in a checkpoint. A restarted process rebuilds its clients' pipelines; they get the global weights each round,
    so what is lost is their optimizer state. If no client answers a round at all, the federation is down: one
    line, and the run stops (its last checkpoint is kept).
    """

    def __init__(self, grid, n: int, timeout_s: float | None = None, start_timeout_s: float = 600.0):
        self.grid, self.n, self.timeout_s = grid, n, timeout_s
        self.last_states: list[dict[str, Any] | None] = [None] * n
        deadline = time.monotonic() + start_timeout_s
        nodes: list[int] = []
        while len(nodes) < n:  # the simulated SuperNodes register asynchronously
            if time.monotonic() > deadline:
                raise RuntimeError(f"flower: {len(nodes)} of {n} SuperNodes registered within "
                                   f"{start_timeout_s:.0f}s")
            time.sleep(0.1)
            nodes = list(grid.get_node_ids())
        # the clients build their pipelines on this first message: it waits for the start timeout, not a round's
        replies = self.send({node: self.config(op="hello") for node in nodes}, "query", timeout_s=start_timeout_s)
        failed = [reason(r) for r in replies.values() if content(r) is None]
        if failed or len(replies) < n:
            raise RuntimeError(f"flower: a client could not start: {failed[0] if failed else 'no reply'}")
        self.node = {int(r.content["config"]["partition"]): node for node, r in replies.items()}

    @staticmethod
    def config(**kw):
        from flwr.app import ConfigRecord, RecordDict

        return RecordDict({"config": ConfigRecord(kw)})

    def send(self, contents: dict[int, Any], kind: str, timeout_s: float | None = None) -> dict[int, Any]:
        """One message per node; replies by node, in the nodes' order (a node without a reply is absent)."""
        from flwr.app import Message

        msgs = [Message(content, dst_node_id=node, message_type=kind) for node, content in contents.items()]
        replies = self.grid.send_and_receive(msgs, timeout=timeout_s or self.timeout_s)
        by_node = {r.metadata.src_node_id: r for r in replies}
        return {node: by_node[node] for node in contents if node in by_node}

    def each(self, contents: dict[int, Any], kind: str) -> dict[int, Any]:
        """``send`` to client k's node for each k in ``contents``; the reply per client k (None if it failed).
        A client that did not answer in time holds the simulation's actor: it is restarted (``restart_actors``)."""
        replies = self.send({self.node[k]: c for k, c in contents.items()}, kind)
        out = {k: replies.get(self.node[k]) for k in contents}
        if any(r is None for r in out.values()):
            restart_actors()
        return out

    def train(self, weights: fgrpo.Weights, rnd: int) -> dict[int, fgrpo.ClientResult | BaseException]:
        from flwr.app import ArrayRecord, ConfigRecord, RecordDict

        msg = RecordDict({"arrays": ArrayRecord(weights), "config": ConfigRecord({"round": rnd})})
        replies = self.each(dict.fromkeys(range(self.n), msg), "train")
        if all(r is None for r in replies.values()):
            raise RunStopped(f"flower: no client answered round {rnd} within driver.round_timeout_s="
                               f"{self.timeout_s}s (all {self.n} hung or gone); the run stops at its last "
                               "checkpoint: resume with --resume")
        out: dict[int, fgrpo.ClientResult | BaseException] = {}
        for k, r in replies.items():
            c = content(r)
            if c is None:
                out[k] = RuntimeError(f"client {k}: {reason(r)}")
                continue
            m = dict(c["metrics"])
            score = m.pop("fgrpo/score")
            out[k] = fgrpo.ClientResult(dict(c["arrays"].to_torch_state_dict()), score, m)
        return out

    def evaluate(self, weights: fgrpo.Weights) -> dict[int, dict[str, float]]:
        from flwr.app import ArrayRecord, RecordDict

        replies = self.each(dict.fromkeys(range(self.n), RecordDict({"arrays": ArrayRecord(weights)})), "evaluate")
        return {k: dict(c["metrics"]) for k, r in replies.items() if (c := content(r)) is not None}

    def states(self) -> list[dict[str, Any] | None]:
        """Every client's state; a failed client's is its last one received (None if never)."""
        replies = self.each({k: self.config(op="get_state") for k in range(self.n)}, "query")
        for k, r in replies.items():
            if (c := content(r)) is not None:
                self.last_states[k] = from_bytes(c["config"]["state"])
        return list(self.last_states)

    def load_states(self, states: list[dict[str, Any] | None]) -> None:
        self.last_states = list(states)
        self.each({k: self.config(op="set_state", state=to_bytes(s)) for k, s in enumerate(states) if s is not None},
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
            fed = FlowerFederation(grid, n, loop.cfg.round_timeout_s or None)
            if states is not None:
                fed.load_states(states)
            holder["result"] = loop(fed)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller, after the simulation shut down
            holder["error"] = e

    # the loop runs in the ServerApp's thread, where signals cannot be caught: this (main) thread takes Ctrl-C /
    # SIGTERM for it, and the loop sees ``session.stopping`` after its round, saves and stops
    with loop.session.signals():
        run_simulation(server, client_app(loop.run, loop.cfg, model_path), num_supernodes=n,
                       backend_config={"client_resources": {"num_cpus": 1, "max_restarts": -1},
                                       "init_args": {"num_cpus": 1}})
    if "error" in holder:
        raise holder["error"]
    if "result" not in holder:
        raise RuntimeError("flower: the ServerApp ended without a result (see the log above)")
    return holder["result"]
