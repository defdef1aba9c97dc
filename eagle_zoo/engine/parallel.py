"""Tensor parallelism over torch.distributed (NCCL on GPUs, gloo on CPUs).

SPMD: every rank builds the same LLM from its shard of the weights and runs the same
deterministic engine loop. Logits are all-gathered before sampling and every request
has its own seeded generator, so every rank computes the same tokens and no token is
ever sent between ranks; only the model's own collectives (all-reduce after
row-parallel layers and vocab-parallel embeddings, all-gather of the logits) run.

How the ranks start (``start()``, called by ``LLM.__init__``):
  torch.distributed already initialised (a worker we spawned, or the user's own
      init): use the world group; its size must equal tensor_parallel_size.
  torchrun (WORLD_SIZE > 1 in the environment): the user's script runs on every rank;
      the process group is initialised from the environment. Every rank returns the
      same outputs; print on rank 0 only if you want one copy.
  otherwise: this process is rank 0 (the driver). It starts ranks 1..N-1 as fresh
      interpreters (``python -m eagle_zoo.engine.tp_worker``: a fresh interpreter does not
      re-run the user's script, so scripts need no ``if __name__ == "__main__"`` guard),
      which build the same LLM and then mirror the driver's engine: every
      ``add_request`` / ``abort`` / ``step`` of rank 0 is broadcast to them over a gloo
      group, one message per step (``DriverEngine``). ``LLM.shutdown()`` (also run at
      exit) stops them.

Groups: the target is built for the world group; an EAGLE head or draft model for the
world group too (draft_tensor_parallel_size = N) or whole on every rank (= 1), each
module keeping the group it was built for (models/parallel_state.py).
"""
from __future__ import annotations

import atexit
import datetime
import os
import pickle
import subprocess
import sys
import threading
import time
import warnings
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .. import envs, hub
from ..models import parallel_state as ps

# Options a user can reach this module through (error messages name them).
TP_OPTION = "tensor_parallel_size"
DRAFT_TP_OPTION = "speculative_config.draft_tensor_parallel_size"
# Config keys a tensor-parallel model splits over the ranks: each must be divisible by
# the tensor-parallel size. num_key_value_heads may instead divide it (kv heads are
# then replicated). Vocabularies need not divide: the embedding and lm_head are padded
# to equal parts.
DIVIDED_KEYS = ("num_attention_heads", "intermediate_size", "moe_intermediate_size", "intermediate_size_mlp")
KV_HEADS_KEY = "num_key_value_heads"

# distributed_executor_backend values (vLLM's names): None picks by how the process started.
BACKENDS = (None, "mp", "external_launcher")
# Workers wait for the driver's next engine call for as long as the driver lives (a
# server may idle for days): the control group must not time out.
CONTROL_TIMEOUT = datetime.timedelta(days=365)
STORE_PREFIX = "eagle_zoo/"


class TensorParallelError(ValueError):
    """Tensor parallelism cannot start as asked; the message says why and what to do."""


# -- checks (all run before any process is started) -----------------------------------


def check_sizes(tensor_parallel_size: Any, pipeline_parallel_size: Any, speculative) -> int:
    """Validates the sizes; returns the draft's tensor-parallel size (1 or the target's)."""
    for name, value in ((TP_OPTION, tensor_parallel_size), ("pipeline_parallel_size", pipeline_parallel_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TensorParallelError(f"{name} must be an integer >= 1, got {value!r}")
    if speculative is not None:
        # Pipeline parallelism + speculation, and a draft TP other than 1 or the target's.
        return speculative.validate_against_target(tensor_parallel_size, pipeline_parallel_size)
    if pipeline_parallel_size != 1:
        raise TensorParallelError(
            f"pipeline_parallel_size={pipeline_parallel_size}: pipeline parallelism is not supported by "
            f"this engine; split the model with {TP_OPTION} instead"
        )
    return tensor_parallel_size


def check_divisible(config: Any, tp: int, option: str = TP_OPTION, what: str = "the target model") -> None:
    """Every size the model splits over ``tp`` ranks must divide evenly; the error names
    the config key, its value and the sizes that would work."""
    if tp == 1:
        return
    for key in DIVIDED_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value % tp:
            raise TensorParallelError(
                f"{option}={tp} does not divide {what}'s {key}={value} (config.json): each rank must hold "
                f"an equal share; use a {option} that divides {value} ({_divisors(value)})"
            )
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, KV_HEADS_KEY, None) or heads
    if isinstance(kv, int) and kv % tp and tp % kv:
        raise TensorParallelError(
            f"{option}={tp} and {what}'s {KV_HEADS_KEY}={kv} (config.json): the size must divide the kv heads "
            f"or be a multiple of them (then kv heads are replicated); use {_divisors(kv)} or a multiple of {kv}"
        )


def _divisors(value: int) -> str:
    sizes = [str(d) for d in range(1, min(value, 16) + 1) if value % d == 0]
    return ", ".join(sizes[:-1]) + " or " + sizes[-1] if len(sizes) > 1 else sizes[0]


def check_devices(tp: int, device: torch.device, local_rank: int = 0) -> None:
    """One GPU per rank on CUDA; any number of ranks on the CPU."""
    if device.type != "cuda":
        if device.type != "cpu":
            raise TensorParallelError(f"{TP_OPTION} > 1 runs on cuda or cpu, not on {device.type}")
        return
    if device.index not in (None, 0):
        raise TensorParallelError(
            f"device={str(device)!r} with {TP_OPTION}={tp}: rank r uses cuda:r, so the device must be 'cuda'; "
            f"choose the GPUs with CUDA_VISIBLE_DEVICES"
        )
    count = torch.cuda.device_count()
    if tp > count or local_rank >= count:
        visible = envs.cuda_visible_devices()
        where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise TensorParallelError(
            f"{TP_OPTION}={tp} needs {tp} GPUs on this host, one per rank, but {count} "
            f"{'is' if count == 1 else 'are'} visible{where}: lower {TP_OPTION} or make more GPUs visible"
        )


# -- the control channel and the driver's engine ---------------------------------------


class Channel:
    """Rank 0 -> every rank: pickled lists of engine calls over a gloo group.

    A length header, then the payload (skipped for the common "step only" message)."""

    STEP_ONLY = -1

    def __init__(self, group):
        self.group = group
        self.header = torch.zeros(1, dtype=torch.long)

    def send(self, ops: list) -> None:
        import torch.distributed as dist

        payload = b"" if ops == [STEP] else pickle.dumps(ops)
        self.header[0] = len(payload) if payload else self.STEP_ONLY
        dist.broadcast(self.header, src=0, group=self.group)
        if payload:
            dist.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), src=0, group=self.group)

    def recv(self) -> list:
        import torch.distributed as dist

        dist.broadcast(self.header, src=0, group=self.group)
        n = int(self.header[0])
        if n == self.STEP_ONLY:
            return [STEP]
        buf = torch.empty(n, dtype=torch.uint8)
        dist.broadcast(buf, src=0, group=self.group)
        return pickle.loads(buf.numpy().tobytes())


STEP = ("step", (), {})
SHUTDOWN = ("shutdown", (), {})


class DriverEngine:
    """Rank 0's EngineCore when rank 0 started the workers: the calls that change the
    engine's state are queued and sent to the workers with the next step, so every rank
    applies the same calls in the same order; everything else is read from rank 0's
    engine. A call that fails here is sent too (it fails the same way there and keeps
    the request counters equal)."""

    def __init__(self, engine, channel: Channel):
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_pending", [])

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def __setattr__(self, name, value):
        setattr(self._engine, name, value)

    def add_request(self, *args, **kwargs):
        self._pending.append(("add_request", args, kwargs))
        return self._engine.add_request(*args, **kwargs)

    def abort(self, *args, **kwargs):
        self._pending.append(("abort", args, kwargs))
        return self._engine.abort(*args, **kwargs)

    def step(self):
        ops, self._pending[:] = self._pending + [STEP], []
        self._channel.send(ops)
        return self._engine.step()

    def unwrap(self):
        return self._engine


# -- process start-up ---------------------------------------------------------------------


@dataclass
class WorkerPool:
    """Ranks 1..N-1 started by rank 0, and the store they rendezvous through."""

    store: Any
    procs: list = field(default_factory=list)
    channel: Optional[Channel] = None
    ready: bool = False

    def check_alive(self, phase: str) -> None:
        for rank, proc in enumerate(self.procs, start=1):
            code = proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"tensor-parallel worker rank {rank} exited with code {code} while {phase}; "
                    f"its output is above"
                )

    def wait_for(self, key: str, phase: str) -> None:
        """Waits until every worker has set ``key/<rank>`` (or reported an error)."""
        keys = [f"{STORE_PREFIX}{key}/{rank}" for rank in range(1, len(self.procs) + 1)]
        timeout = envs.tp_start_timeout_s()
        deadline = time.monotonic() + timeout
        while not self.store.check(keys):
            for rank in range(1, len(self.procs) + 1):
                error_key = f"{STORE_PREFIX}error/{rank}"
                if self.store.check([error_key]):
                    message = self.store.get(error_key).decode(errors="replace")
                    raise RuntimeError(f"tensor-parallel worker rank {rank} failed while {phase}:\n{message}")
            self.check_alive(phase)
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"tensor-parallel workers did not finish {phase} within {timeout:.0f} s "
                    f"({envs.TP_START_TIMEOUT})"
                )
            time.sleep(0.02)

    def announce_stop(self) -> None:
        """Tells the workers to leave their loop (they then tear down their process group)."""
        if self.ready and self.channel is not None:
            try:
                self.channel.send([SHUTDOWN])
            except Exception:  # a worker is gone already: the others are stopped below
                pass
            self.channel = None

    def stop(self, timeout: float = 30.0) -> None:
        self.announce_stop()
        deadline = time.monotonic() + (timeout if self.ready else 0.0)
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        self.ready = False


def _backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_process_group(backend: str, **kwargs) -> None:
    """torch.distributed.init_process_group, once the torch modules whose functions take
    ``group=group.WORLD`` as a default are imported: imported later (transformers' model
    modules import them), those defaults would hold the world group for the life of the
    process, so destroy_process_group() would leave its gloo threads running and the
    interpreter's exit would free it, where a rank can abort ("terminate called without an
    active exception")."""
    import torch.distributed as dist
    import torch.distributed.nn.functional  # noqa: F401
    import torch.distributed.optim.zero_redundancy_optimizer  # noqa: F401

    dist.init_process_group(backend, **kwargs)


def _launch_workers(tp: int, device: torch.device, llm_kwargs: dict) -> WorkerPool:
    """Rank 0: start ranks 1..tp-1, then join them in one process group."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world_size=tp, is_master=True, wait_for_workers=False)
    pool = WorkerPool(store)
    try:
        payload = pickle.dumps({
            "world_size": tp, "port": store.port, "backend": _backend(device),
            # A worker joins the group the driver made: it must not start workers itself.
            "llm_kwargs": dict(llm_kwargs, distributed_executor_backend=None), "sys_path": list(sys.path),
        })
    except Exception as exc:
        raise TensorParallelError(
            f"{TP_OPTION}={tp}: the LLM's arguments must be picklable to start the workers ({exc})"
        ) from None
    for rank in range(1, tp):
        env = dict(os.environ, **{envs.TP_RANK: str(rank)})
        proc = subprocess.Popen([sys.executable, "-m", "eagle_zoo.engine.tp_worker"], stdin=subprocess.PIPE, env=env)
        pool.procs.append(proc)
        # The pipe stays open: a worker sees end-of-file when this process goes away.
        proc.stdin.write(len(payload).to_bytes(8, "little") + payload)
        proc.stdin.flush()
    try:
        pool.wait_for("alive", "starting")
        init_process_group(_backend(device), store=dist.PrefixStore(STORE_PREFIX + "pg", store), rank=0,
                           world_size=tp)
        pool.channel = Channel(dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT))
    except BaseException:
        pool.stop()
        raise
    return pool


@dataclass
class TensorParallel:
    """This process's part in a tensor-parallel LLM."""

    size: int
    rank: int
    device: torch.device
    target: ps.TPGroup
    draft: ps.TPGroup
    launcher: str  # "spawn" (we are rank 0 and started the workers), "torchrun", "external"
    pool: Optional[WorkerPool] = None

    def attach(self, engine):
        """After this rank built its engine: a driver waits for its workers to have
        built theirs and returns the engine that mirrors its calls to them."""
        if self.pool is None:
            return engine
        try:
            self.pool.wait_for("ready", "building the model")
        except BaseException:
            self.shutdown()
            raise
        self.pool.ready = True
        return DriverEngine(engine, self.pool.channel)

    def shutdown(self) -> None:
        global _active_driver
        if self.pool is None:
            return
        pool, self.pool = self.pool, None
        # Every rank tears its process group down at the same time (destroy_process_group).
        pool.announce_stop()
        destroy_process_group()
        pool.stop()
        if _active_driver is self:
            _active_driver = None


_active_driver: Optional[TensorParallel] = None
_we_initialised = False


def start(llm_kwargs: dict, speculative, device: torch.device, owner: Any = None) -> Optional[TensorParallel]:
    """Checks the parallel options and brings up this process's rank; None at TP 1.

    ``llm_kwargs``: the LLM's own arguments (workers build the same LLM from them);
    ``owner``: the LLM, whose garbage collection stops the workers."""
    tp = llm_kwargs.get("tensor_parallel_size", 1)
    pp = llm_kwargs.get("pipeline_parallel_size", 1)
    backend = llm_kwargs.get("distributed_executor_backend")
    if backend not in BACKENDS:
        raise TensorParallelError(
            f"distributed_executor_backend={backend!r} is not supported; use one of {BACKENDS} "
            f"(None: torchrun's ranks when started by torchrun, else workers the engine starts)"
        )
    draft_tp = check_sizes(tp, pp, speculative)
    if tp == 1:
        return None
    import torch.distributed as dist

    from .model_loader import load_config, resolve_model_dir

    global _active_driver, _we_initialised
    if _active_driver is not None:
        if _active_driver.pool is not None and not _active_driver.pool.ready:
            _active_driver.shutdown()  # left over from an LLM whose construction failed
        else:
            raise TensorParallelError(
                "a tensor-parallel LLM started by this process is still running; call its shutdown() first "
                "(one tensor-parallel LLM per process at a time)"
            )
    local_rank = _local_rank()
    check_devices(tp, device, local_rank)
    fetch = hub.Fetch(llm_kwargs.get("download_dir"), llm_kwargs.get("hf_token"))
    config = load_config(resolve_model_dir(llm_kwargs["model"], llm_kwargs.get("revision"), fetch))
    check_divisible(config, tp)

    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    pool = None
    external = dist.is_initialized() or envs.torchrun_world_size() > 1
    if backend == "external_launcher" and not external:
        raise TensorParallelError(
            f"distributed_executor_backend='external_launcher' but this process was not started by torchrun "
            f"(no WORLD_SIZE) and torch.distributed is not initialised: run it with "
            f"torchrun --nproc-per-node {tp}, or leave the option out to let the engine start the workers"
        )
    if backend == "mp" and external:
        raise TensorParallelError(
            "distributed_executor_backend='mp' starts the workers itself, but this process is already one "
            "rank of a torch.distributed job (torchrun): use 'external_launcher' or leave the option out"
        )
    if dist.is_initialized():
        launcher = "external"
    elif envs.torchrun_world_size() > 1:
        launcher = "torchrun"
        _check_world(envs.torchrun_world_size(), tp, "torchrun started")
        init_process_group(_backend(device))
        if not _we_initialised:
            _we_initialised = True
            atexit.register(_destroy_at_exit)
    else:
        launcher = "spawn"
        pool = _launch_workers(tp, device, llm_kwargs)
    _check_world(dist.get_world_size(), tp, "torch.distributed runs")
    target = ps.group_of(None)
    parallel = TensorParallel(tp, target.rank, device, target, ps.SINGLE if draft_tp == 1 else target,
                              launcher, pool)
    if pool is not None:
        _active_driver = parallel
        if owner is not None:  # stops the workers when the LLM goes away (and at exit)
            weakref.finalize(owner, parallel.shutdown)
        else:
            atexit.register(parallel.shutdown)
    return parallel


def _local_rank() -> int:
    """This rank's GPU: torchrun's LOCAL_RANK, a spawned worker's rank, else the global rank."""
    import torch.distributed as dist

    local_rank, tp_rank = envs.torchrun_local_rank(), envs.tp_rank()
    if local_rank is not None:
        return local_rank
    if tp_rank is not None:
        return tp_rank
    return dist.get_rank() if dist.is_initialized() else envs.torchrun_rank()


def _check_world(world: int, tp: int, what: str) -> None:
    if world != tp:
        raise TensorParallelError(
            f"{what} {world} processes but {TP_OPTION}={tp}: every process is one tensor-parallel rank, so "
            f"they must be equal (torchrun --nproc-per-node {tp}, or plain python and the engine starts them)"
        )


DESTROY_TIMEOUT_S = 60.0


def destroy_process_group(timeout: float = DESTROY_TIMEOUT_S) -> None:
    """Tears this rank's process groups down, every rank at the same time (NCCL's teardown
    waits for its peers). CUDA graphs go first: graphs that captured NCCL collectives make
    destroy_process_group() wait forever (PyTorch issue 115388). Should it hang anyway,
    shutdown goes on after ``timeout`` seconds with a warning instead of hanging the
    process: the operating system frees what is left when it exits."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    from .graphs import release_all_graphs

    release_all_graphs()
    done = threading.Event()

    def destroy() -> None:
        dist.destroy_process_group()
        done.set()

    threading.Thread(target=destroy, name="eagle-zoo-destroy-process-group", daemon=True).start()
    if not done.wait(timeout):
        warnings.warn(f"torch.distributed.destroy_process_group() did not return within {timeout:.0f} s; "
                      f"shutting down without it", RuntimeWarning, stacklevel=2)


def _destroy_at_exit() -> None:
    destroy_process_group()


# -- build scopes -------------------------------------------------------------------------


@contextmanager
def _scope(parallel: TensorParallel, group: ps.TPGroup, option: str, what: str):
    """Build for ``group``; a failure stops the workers at once (they are building the
    same thing and would fail the same way, or wait for a driver that is not coming)."""
    with ps.use(group):
        try:
            yield
        except BaseException as exc:
            parallel.shutdown()
            if isinstance(exc, ps.TPDivisionError):
                raise TensorParallelError(f"{option}={group.size}: {what}: {exc}") from None
            raise


def target_scope(parallel: Optional[TensorParallel]):
    """Build the target model (and its tokenizer) for the target's group."""
    if parallel is None:
        return nullcontext()
    return _scope(parallel, parallel.target, TP_OPTION, "the target model")


def draft_scope(parallel: Optional[TensorParallel]):
    """Build the draft (EAGLE head or draft model) for the draft's group."""
    if parallel is None:
        return nullcontext()
    what = "the draft (use draft_tensor_parallel_size 1 to run it whole on every rank)"
    return _scope(parallel, parallel.draft, DRAFT_TP_OPTION, what)
