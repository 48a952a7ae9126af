"""TVM MetaSchedule with the team's tuning records: a database on the tunecache server.

Importing :mod:`tunecache` does not import TVM; importing this package does.

Example:
    >>> import tvm
    >>> from tvm.s_tir import meta_schedule as ms
    >>> import tunecache.tvm
    >>> from tunecache.tvm import Database
    >>> target = tunecache.tvm.host_target()  # {"kind": "llvm", "num-cores": …, "mcpu": …}
    >>> db = Database(target=target)  # TUNECACHE_URL, TUNECACHE_TOKEN  # doctest: +SKIP
    >>> sch = ms.tir_integration.compile_tir(db, mod, target)  # doctest: +SKIP
    >>> lib = tvm.tirx.build(sch.mod if sch is not None else mod, target=target)  # doctest: +SKIP

``tunecache tune --tvm FILE.py:NAME`` tunes a module on this machine, validates the best schedule
against the unscheduled module and uploads the validated records to the same database.
"""

from __future__ import annotations

from tunecache.tvm.database import Database
from tunecache.tvm.target import host_target
from tunecache.tvm.wire import partition_for, workload_key

__all__ = ["Database", "host_target", "partition_for", "workload_key"]
