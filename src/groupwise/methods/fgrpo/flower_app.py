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
import logging
import os
import pickle
import re
import signal
import threading
import time
from typing import Any

from groupwise.lazy import torch
from groupwise.methods.fgrpo import federated as fgrpo
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


class ClientSetup:
    """What every client is built from (the run's config, the driver's, the model it starts from), sent with the
    ClientApp into the simulation's actors. Unpickling it imports the run's plug-ins first: an actor is a fresh
    process, and pickle names a class by its module, so a config class defined in a plug-in file (module
    ``groupwise_plugin_*``, ``plugins.import_ref``) exists there only once that file has been imported."""

    def __init__(self, run, cfg, model_path: str | None):
        self.run, self.cfg, self.model_path = run, cfg, model_path

    def __reduce__(self):
        from ray import cloudpickle  # the simulation's own pickler (a callable in the config may be a closure)

        return _unpickle_setup, (list(self.run.plugins), cloudpickle.dumps((self.run, self.cfg, self.model_path)))


def _unpickle_setup(plugin_refs: list[str], data: bytes) -> ClientSetup:
    from groupwise import plugins

    for ref in plugin_refs:  # idempotent: a file is imported once per process
        plugins.import_ref(ref)
    return ClientSetup(*pickle.loads(data))


def cached_client(k: int, setup: ClientSetup) -> fgrpo.Client:
    """Client k of this run, built on first use in this process (a module-level function, so that the
    ClientApp's handlers pickle it by reference into the simulation's actors, without the lock)."""
    torch.set_num_threads(setup.run.trainer.threads or 1)
    with _LOCK:
        key = (str(setup.run.run_dir), k)
        if key not in _CLIENTS:
            _CLIENTS[key] = fgrpo.Client(setup.run, setup.cfg, k, setup.model_path)
        return _CLIENTS[key]


def client_app(setup: ClientSetup):
    """The ClientApp: each handler finds (or builds) client ``partition-id``'s ``fgrpo.Client``."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    def client(ctx: Context) -> fgrpo.Client:
        return cached_client(int(ctx.node_config["partition-id"]), setup)

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


AUTO_FACTOR = 5.0
"""``driver.round_timeout_s`` unset: a client's reply may take this many times the longest wait for a reply of
the same kind so far (``auto_timeout``) ..."""
AUTO_MIN_S = 120.0
"""... and at least this long (a busy machine's slow round is not a hang) ..."""
AUTO_FIRST_S = 1800.0
"""... and this long before a reply of that kind was ever measured (the first round, the first eval)."""
POLL_S = 0.05
"""How often the server looks for replies (and for a stopped simulation runtime)."""
STOP_JOIN_S = 30.0
"""The simulation runtime stopped: how long the ServerApp's thread is given to see it and end."""


def auto_timeout(longest: float | None) -> float:
    """``driver.round_timeout_s`` unset: the longest wait for a client's next reply, from the longest wait for one
    of the same kind measured so far (None: none yet): max(``AUTO_MIN_S``, ``AUTO_FACTOR`` x longest), or
    ``AUTO_FIRST_S``."""
    return AUTO_FIRST_S if longest is None else max(AUTO_MIN_S, AUTO_FACTOR * longest)


def reason(reply) -> str:
    if reply is None:
        return "no reply in time (driver.round_timeout_s)"
    return reply.error.reason if reply.has_error() else "a reply without content"


def client_error(text: str) -> str:
    """An error reply's reason in one line: a ClientApp's exception comes back as Ray's remote traceback, wrapped
    in Flower's ``ClientAppException``; its last ``Type: message`` line of another type is the client's own
    error (``OSError: ...``; a dotted type loses its module)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    own = [line for line in lines if re.match(r"[A-Za-z_][\w.]*: \S", line)
           and "ClientAppException" not in line and not line.startswith("ray.")]
    return re.sub(r"^[\w.]*\.(?=\w+: )", "", own[-1]) if own else (lines[-1] if lines else text)


class FlowerFederation:
    """``fgrpo.InProcess``'s interface over a Flower ``Grid``: each call is one message to every client.

    A client that fails (raises, its process dies, or it does not answer in time: then the actor it holds is
    killed and Ray restarts it) is left out of that call: a failed round for it (counted by the server), a
    missing entry in that eval (``eval/clients`` says how many answered), and its last state received in a
    checkpoint. A restarted process rebuilds its clients' pipelines; they get the global weights each round, so
    what is lost is their optimizer state. If no client answers a round at all, the federation is down: one
    line, and the run stops (its last checkpoint is kept).

    In time: within ``timeout_s`` of the message (``driver.round_timeout_s``; 0: no limit), or, with
    ``timeout_s=None`` (the config's default), within ``auto_timeout`` of the previous reply of the call (or of
    the message): the clients share one actor and answer one after another, so each wait is one client's
    round (or eval, or state query), measured per kind of message. After a restart the next call's waits may
    also take ``AUTO_FACTOR`` x the longest client start-up measured (the clients rebuild). The clients' start
    (their first message, which builds their pipelines) waits ``start_timeout_s`` in all. ``stop`` set (the
    simulation runtime stopped): every wait ends at once with ``RunStopped``.
    """

    def __init__(self, grid, n: int, timeout_s: float | None = None, start_timeout_s: float = 600.0,
                 stop: threading.Event | None = None):
        self.grid, self.n, self.timeout_s, self.start_timeout_s = grid, n, timeout_s, start_timeout_s
        self.stop = stop or threading.Event()
        self.longest: dict[str, float] = {}  # per kind of message (and "start"): the longest wait for one reply
        self.restarted = False
        self.limit = 0.0  # the last call's limit on a wait, in seconds (for its message)
        self.last_states: list[dict[str, Any] | None] = [None] * n
        deadline = time.monotonic() + start_timeout_s
        nodes: list[int] = []
        while len(nodes) < n:  # the simulated SuperNodes register asynchronously
            if time.monotonic() > deadline:
                raise RunStopped(f"flower: {len(nodes)} of {n} SuperNodes registered within {start_timeout_s:.0f}s")
            self._check_stop()
            time.sleep(0.1)
            nodes = list(grid.get_node_ids())
        # the clients build their pipelines on this first message: it waits for the start timeout, not a round's
        replies = self.send({node: self.config(op="hello") for node in nodes}, "query", measure="start")
        failed = [client_error(reason(r)) for r in replies.values() if content(r) is None]
        if failed or len(replies) < n:
            raise RunStopped(f"flower: a client could not start: "
                             f"{failed[0] if failed else f'no reply within {start_timeout_s:.0f}s'}")
        self.node = {int(r.content["config"]["partition"]): node for node, r in replies.items()}

    @staticmethod
    def config(**kw):
        from flwr.app import ConfigRecord, RecordDict

        return RecordDict({"config": ConfigRecord(kw)})

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise RunStopped("flower: the simulation runtime stopped")

    def wait_limit(self, measure: str) -> tuple[float, bool]:
        """The limit on this call's waits for ``measure`` (a kind of message, or "start"), in seconds (inf: none),
        and whether it counts from the previous reply (auto) or from the message."""
        if measure == "start":
            return self.start_timeout_s, False
        if self.timeout_s is not None:
            return self.timeout_s or float("inf"), False
        limit = auto_timeout(self.longest.get(measure))
        if self.restarted and "start" in self.longest:
            limit += AUTO_FACTOR * self.longest["start"]
        return limit, True

    def send(self, contents: dict[int, Any], kind: str, measure: str | None = None) -> dict[int, Any]:
        """One message per node; replies by node, in the nodes' order (a node without a reply in time is absent).
        Each wait for a reply is measured under ``measure`` (default: the message's kind)."""
        from flwr.app import Message

        measure = measure or kind
        self.limit, from_last = self.wait_limit(measure)
        msgs = [Message(content, dst_node_id=node, message_type=kind) for node, content in contents.items()]
        waiting, got = set(self.grid.push_messages(msgs)), []
        start = last = time.monotonic()
        while waiting:
            self._check_stop()
            new = list(self.grid.pull_messages(waiting))
            now = time.monotonic()
            if new:
                self.longest[measure] = max(self.longest.get(measure, 0.0), now - last)
                got += new
                waiting -= {r.metadata.reply_to_message_id for r in new}
                last = now
            elif now - (last if from_last else start) > self.limit:
                break
            else:
                time.sleep(POLL_S)
        by_node = {r.metadata.src_node_id: r for r in got}
        return {node: by_node[node] for node in contents if node in by_node}

    def each(self, contents: dict[int, Any], kind: str) -> dict[int, Any]:
        """``send`` to client k's node for each k in ``contents``; the reply per client k (None if it failed).
        A client that did not answer in time holds the simulation's actor: it is restarted (``restart_actors``)."""
        replies = self.send({self.node[k]: c for k, c in contents.items()}, kind)
        self.restarted = False
        out = {k: replies.get(self.node[k]) for k in contents}
        if any(r is None for r in out.values()):
            self.restarted = restart_actors() > 0
        return out

    def waited(self) -> str:
        """The last call's limit, as a line's words."""
        if self.timeout_s is not None:
            return f"within driver.round_timeout_s={self.timeout_s}s"
        return (f"within {self.limit:.0f}s of the previous reply (driver.round_timeout_s unset: {AUTO_FACTOR:g} x the "
                f"longest wait for a reply so far, at least {AUTO_MIN_S:.0f}s; {AUTO_FIRST_S:.0f}s before the first)")

    def train(self, weights: fgrpo.Weights, rnd: int) -> dict[int, fgrpo.ClientResult | BaseException]:
        from flwr.app import ArrayRecord, ConfigRecord, RecordDict

        msg = RecordDict({"arrays": ArrayRecord(weights), "config": ConfigRecord({"round": rnd})})
        replies = self.each(dict.fromkeys(range(self.n), msg), "train")
        if all(r is None for r in replies.values()):
            raise RunStopped(f"flower: no client answered round {rnd} {self.waited()}: all {self.n} hung or gone; "
                             "the run stops at its last checkpoint: resume with --resume")
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


class RuntimeLog(logging.Filter):
    """Keeps the simulation runtime's own crash report (an ERROR line and a traceback, logged twice by
    ``flwr.simulation``) off the screen: the run says it in one line and the report goes to a file."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and record.funcName in ("run_api", "_main_loop"):
            self.records.append(record.getMessage())
            return False
        return True


def root_cause(e: BaseException) -> str:
    while (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


def run(loop: fgrpo.Loop, states: list | None, model_path: str | None) -> dict[str, dict[str, float]]:
    """Run ``loop`` as a ServerApp over a simulated federation (one Ray CPU, one client actor). If the simulation
    runtime itself stops (Ray does not start in time, or dies), the ServerApp's thread is stopped too and the
    run ends in one line; the runtime's report is in ``flower_runtime.log`` in the run directory."""
    _require()
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from groupwise.loop.workers import kept

    n, holder, stop = len(loop.cfg.clients), {}, threading.Event()
    server = ServerApp()

    @server.main()
    def main(grid: Grid, ctx: Context) -> None:
        holder["thread"] = threading.current_thread()
        try:
            fed = FlowerFederation(grid, n, loop.cfg.round_timeout_s, stop=stop)
            if states is not None:
                fed.load_states(states)
            holder["result"] = loop(fed)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller, after the simulation shut down
            holder["error"] = e

    # the loop runs in the ServerApp's thread, where signals cannot be caught: this (main) thread takes Ctrl-C /
    # SIGTERM for it, and the loop sees ``session.stopping`` after its round, saves and stops
    flwr_log, report = logging.getLogger("flwr"), RuntimeLog()
    flwr_log.addFilter(report)
    try:
        with loop.session.signals():
            run_simulation(server, client_app(ClientSetup(loop.run, loop.cfg, model_path)), num_supernodes=n,
                           backend_config={"client_resources": {"num_cpus": 1, "max_restarts": -1},
                                           "init_args": {"num_cpus": 1}})
    except Exception as e:  # the runtime stopped (flwr wraps its cause): the ServerApp's thread must not go on
        stop.set()
        if "thread" in holder:
            holder["thread"].join(STOP_JOIN_S)
        log = loop.run.run_dir / "flower_runtime.log"
        log.write_text("\n".join(report.records) + "\n")
        raise RunStopped(f"flower: the simulation runtime stopped ({root_cause(e)}); its report: {log}; "
                         f"{kept(loop.run.run_dir)}: resume with --resume") from None
    finally:
        flwr_log.removeFilter(report)
    if "error" in holder:
        raise holder["error"]
    if "result" not in holder:
        raise RuntimeError("flower: the ServerApp ended without a result (see the log above)")
    return holder["result"]
