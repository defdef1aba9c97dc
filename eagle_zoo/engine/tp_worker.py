"""`python -m eagle_zoo.engine.tp_worker`: one tensor-parallel rank started by rank 0.

Rank 0 (engine/parallel.py) writes a pickled start-up record on this process's stdin
and keeps the pipe open. The worker joins rank 0's store and process group, builds
the same LLM (its own shard), reports "ready" (or its traceback) through the store,
then applies rank 0's engine calls as they arrive, one message per engine step,
until told to shut down. End-of-file on stdin means rank 0 is gone: exit at once.
"""
from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
import traceback

from .. import envs

log = logging.getLogger("eagle_zoo.tp_worker")


def _exit_when_driver_goes(fd: int) -> None:
    # Unbuffered reads: a daemon thread blocked in a buffered reader would stop the
    # interpreter's own shutdown. Nothing more is written: this returns at end-of-file.
    try:
        while os.read(fd, 4096):
            pass
    finally:
        os._exit(0)


def _read_start(fd: int) -> dict:
    """The start-up record: an 8-byte length, then the pickle (read unbuffered, so
    nothing after it is consumed)."""
    def read(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = os.read(fd, n - len(data))
            if not chunk:
                raise SystemExit("eagle_zoo.engine.tp_worker: rank 0 went away before sending the start-up record")
            data += chunk
        return data

    return pickle.loads(read(int.from_bytes(read(8), "little")))


def serve(engine, channel) -> None:
    """Apply rank 0's calls in order until SHUTDOWN (see parallel.DriverEngine)."""
    while True:
        for name, args, kwargs in channel.recv():
            if name == "shutdown":
                return
            try:
                getattr(engine, name)(*args, **kwargs)
            except Exception:
                # A rejected request failed the same way on rank 0, which told its
                # caller. Anything else should not happen: say so.
                (log.debug if name == "add_request" else log.exception)("engine call %s failed", name)


def main() -> int:
    import torch
    import torch.distributed as dist

    from . import parallel

    # Ctrl-C in a terminal reaches every process of the group: rank 0 handles it and
    # stops this worker (or its exit closes the pipe).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    start = _read_start(sys.stdin.fileno())
    threading.Thread(target=_exit_when_driver_goes, args=(sys.stdin.fileno(),), daemon=True).start()
    for entry in reversed(start["sys_path"]):  # what rank 0 could import, this rank can
        if entry not in sys.path:
            sys.path.insert(1, entry)
    rank, world = envs.tp_rank(), start["world_size"]
    if start["backend"] == "gloo":  # ranks share the CPU cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    else:
        torch.cuda.set_device(rank)
    store = dist.TCPStore("127.0.0.1", start["port"], world_size=world, is_master=False)
    store.set(f"{parallel.STORE_PREFIX}alive/{rank}", "1")
    parallel.init_process_group(start["backend"], store=dist.PrefixStore(parallel.STORE_PREFIX + "pg", store),
                                rank=rank, world_size=world)
    channel = parallel.Channel(dist.new_group(backend="gloo", timeout=parallel.CONTROL_TIMEOUT))
    try:
        from .llm import LLM

        llm = LLM(**start["llm_kwargs"])
    except BaseException:
        store.set(f"{parallel.STORE_PREFIX}error/{rank}", traceback.format_exc())
        return 1
    store.set(f"{parallel.STORE_PREFIX}ready/{rank}", "1")
    serve(llm.engine, channel)
    parallel.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
