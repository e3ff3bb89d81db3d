"""Several nodes (NNODES > 1, the same command on each, a shared --output_dir): all join every stage; node 0 alone
writes the run's files and exports; the others wait for them (SWIFT_PLT_NODE_WAIT) or node 0's reported failure."""
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from swift_plt.recipe.options import RecipeError
from swift_plt.recipe.process import Launch, env_prefix, model_parallel_size

NODE_VARS = ('NNODES', 'NODE_RANK', 'MASTER_ADDR', 'MASTER_PORT')  # torchrun's, passed on by ms-swift
WAIT_ENV = 'SWIFT_PLT_NODE_WAIT'
DEFAULT_WAIT_S = 3600.0
POLL_S = 2.0  # how often a waiting node looks
STATUS_FILE = 'node0_status.json'  # in OUTPUT_DIR/logs: node 0's current step and its state


class NodeWaitError(RuntimeError):
    """What another node waited for did not come: node 0 failed, or the wait timed out."""


@dataclass(frozen=True)
class Nodes:
    count: int = 1
    rank: int = 0
    wait_s: float = DEFAULT_WAIT_S

    @property
    def multi(self) -> bool:
        return self.count > 1

    @property
    def leader(self) -> bool:
        """Node 0 (or the only node): writes plan.json, the reports and the summary, and runs the export."""
        return self.rank == 0

    def log_name(self, step: str) -> str:
        """The log file of ``step`` on this node (node 0's is the single-node one)."""
        return f'{step}.log' if self.leader else f'{step}.node{self.rank}.log'


def read_nodes(environ: Mapping[str, str]) -> Nodes:
    """This node from NNODES / NODE_RANK (one node without NNODES); RecipeError for an incomplete multi-node set-up."""
    raw = (environ.get('NNODES') or '1').strip()
    lo, _, hi = raw.partition(':')  # torchrun also takes MIN:MAX (elastic)
    try:
        count, top = int(lo), int(hi or lo)
    except ValueError:
        raise RecipeError(f'NNODES={raw!r}: expected the number of nodes.') from None
    if top <= 1:
        return Nodes()
    if count != top:
        raise RecipeError(f'NNODES={raw}: elastic node counts are not supported; set NNODES to the number of nodes.')
    missing = [k for k in ('NODE_RANK', 'MASTER_ADDR') if not environ.get(k)]
    if missing:
        raise RecipeError(f'NNODES={count}: set {" and ".join(missing)} on every node (NODE_RANK 0..{count - 1}, '
                          'MASTER_ADDR the address of node 0; the same MASTER_PORT everywhere).')
    try:
        rank = int(environ['NODE_RANK'])
        wait_s = float(environ.get(WAIT_ENV) or DEFAULT_WAIT_S)
    except ValueError as e:
        raise RecipeError(f'NODE_RANK / {WAIT_ENV}: {e}') from None
    if not 0 <= rank < count:
        raise RecipeError(f'NODE_RANK={rank} is not in 0..{count - 1} (NNODES={count}).')
    if wait_s <= 0:
        raise RecipeError(f'{WAIT_ENV}={wait_s:g}: expected seconds > 0.')
    return Nodes(count, rank, wait_s)


def node_note(nodes: Nodes, environ: Mapping[str, str]) -> str:
    """What this node is and does, for the user."""
    given = {k: environ[k] for k in NODE_VARS if k in environ}
    role = ('writes plan.json, the reports and the summary, runs the export' if nodes.leader else
            f'waits for node 0\'s files up to {nodes.wait_s:g} s ({WAIT_ENV})')
    return f'node {nodes.rank} of {nodes.count} ({env_prefix(given)}): joins every stage; {role}'


def node0_export_launch(export_args: Sequence[str], environ: Mapping[str, str]) -> Launch:
    """The export on node 0 alone: NNODES=1, NODE_RANK=0, the user's NPROC_PER_NODE, else TP·PP·CP of the export."""
    n = environ.get('NPROC_PER_NODE') or str(model_parallel_size(export_args))
    env = {'NNODES': '1', 'NODE_RANK': '0', 'NPROC_PER_NODE': n}
    return Launch(env, int(n) if n.isdigit() else None, f'{env_prefix(env)} (node 0 alone)')


class LeaderStatus:
    """Node 0's step and state in OUTPUT_DIR/logs/node0_status.json; every record carries this invocation's token and
    a counter, so another node tells a new record from one of an earlier run."""

    def __init__(self, out: str):
        self.path = os.path.join(out, 'logs', STATUS_FILE)
        self.token, self.count = uuid.uuid4().hex, 0

    def write(self, step: str, state: str, **extra) -> None:
        self.count += 1
        record = dict(step=step, state=state, token=self.token, n=self.count, host=socket.gethostname(),
                      pid=os.getpid(), **extra)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = f'{self.path}.{self.token}.tmp'
        with open(tmp, 'w', encoding='utf-8') as f:
            json.dump(record, f)
        os.replace(tmp, self.path)  # readers never see half a record

    def read(self) -> Optional[dict]:
        try:
            with open(self.path, encoding='utf-8') as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def step(self, name: str, log: str, fn: Callable[[], int]) -> int:
        """Run ``fn`` (a step of node 0), recording running, then done or failed (its exit code or exception)."""
        self.write(name, 'running', log=log)
        try:
            rc = fn()
        except BaseException as e:
            self.write(name, 'failed', log=log, error=f'{type(e).__name__}: {e}'[:500])
            raise
        self.write(name, 'done' if rc == 0 else 'failed', log=log, rc=rc)
        return rc


def wait_for(what: str, ready: Callable[[], bool], nodes: Nodes, status: LeaderStatus, since: Optional[dict],
             poll_s: Optional[float] = None, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep) -> None:
    """Poll ``ready`` until it holds; NodeWaitError when node 0 records a failure newer than ``since`` (its status
    before this node's step) or after ``nodes.wait_s`` seconds."""
    start = clock()
    while not ready():
        now = status.read()
        if now and now != since and now.get('state') == 'failed':
            why = now.get('error') or f'exit code {now.get("rc")}'
            raise NodeWaitError(f'node 0 failed at {now.get("step")} ({why}; log: {now.get("log")}) while node '
                                f'{nodes.rank} waited for {what}. Fix it and rerun the same command on every node.')
        waited = clock() - start
        if waited >= nodes.wait_s:
            raise NodeWaitError(f'node {nodes.rank} waited {waited:.0f} s for {what}, which node 0 writes; is node 0 '
                                'running the same command on the same --output_dir (shared storage)? Node 0\'s '
                                f'last status: {now}. {WAIT_ENV} sets the wait.')
        sleep(min(POLL_S if poll_s is None else poll_s, max(nodes.wait_s - waited, 0.01)))
