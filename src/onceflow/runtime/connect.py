"""onceflow on Spark Connect: what the server must have, checked once per session.

On Spark Connect the client holds no JVM: the ``foreachBatch`` function of
:func:`onceflow.write_stream` is pickled and runs in a Python worker on the server, and the
data sources onceflow registers are imported there by name. So:

1. **onceflow in the server's Python** is required: :func:`check_server` runs one Python task on
   the server that imports onceflow; without it the error names the interpreter and says to
   ``pip install onceflow`` there (a server admin's step, docs/connect.md).
2. **onceflow's jars on the server** are optional: :func:`server_has` asks the server to load a
   class of each (SQL ``reflect`` on a static member); :func:`onceflow.session` with
   ``remote=`` then names onceflow's id state store and checkpoint file manager in the session,
   and where the server lacks them Spark's own run, said in one line.
3. **The checkpoint where the server is**: ``write_stream`` reads (and mends) Spark's
   checkpoint before the query starts — its logs, an unfinished first batch, the sink's and the
   id store's checks. Where the client sees the server's checkpoint directory
   (:func:`sees_checkpoint`), it reads it itself; else (a path only the server has) the steps
   run on the server's driver (:mod:`onceflow.engine.serverside`).
4. **A local checkpoint's files** on a server without onceflow's checkpoint file manager: where
   both sides see the checkpoint (a local file system), :func:`start_local` names Spark's
   ``FileSystemBasedCheckpointFileManager`` for that query alone — what onceflow's manager picks
   for a local path — instead of Spark's default, whose renames run ``readlink`` processes.
5. **A server that goes away**: Spark's client retries a call to a server that does not answer
   for at least ten minutes (its ``DefaultPolicy``), so a client waiting on a query whose server
   was killed sits silent that long. While onceflow's query waits, :func:`bounded_retries`
   keeps the client's own policies but stops each call's retries once the server has not answered
   for :func:`server_wait_s` seconds; the caller then raises :class:`ServerLostError` naming the
   server (:func:`server_lost`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError, ServerLostError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_log = logging.getLogger("onceflow.remote")
_CHECKED: set[str] = set()

PROBES = {
    "org.apache.spark.sql.onceflow.IdStateStoreProvider": "DELTA",
    "org.apache.spark.sql.onceflow.LocalCheckpointFileManager": "NAME",
}
"""Class -> a static member of it (its companion object's) that :func:`server_has` reflects on."""

SPARKS_LOCAL_FILES = ("org.apache.spark.sql.execution.streaming.checkpointing."
                      "FileSystemBasedCheckpointFileManager")
"""Spark's checkpoint file manager through Hadoop's FileSystem API: :func:`start_local` names it."""

_STARTING = threading.Lock()
"""Held while :func:`start_local` has its setting in a session (one query's start at a time)."""


def server_has(spark: Any, class_name: str) -> bool:
    """Whether the Connect server's driver loads ``class_name`` (one of :data:`PROBES`)."""
    try:
        spark.sql(f"SELECT reflect('{class_name}', '{PROBES[class_name]}') AS probe").collect()
    except Exception as exc:  # noqa: BLE001 - Spark says "class ... not found" as an AnalysisException
        if "not found" in str(exc) or "UNEXPECTED_CLASS_TYPE" in str(exc):
            return False
        raise
    return True


def _server_python() -> str:
    """Runs on the server: its interpreter and onceflow's location there (an import error if none)."""
    import sys

    import onceflow

    return f"{sys.executable} {onceflow.__file__}"


def check_server(spark: Any) -> None:
    """Refuse a Connect server whose Python cannot import onceflow (once per session).

    Raises:
        ConfigError: Naming the server's error and what to install.
    """
    session_id = str(getattr(spark, "session_id", ""))
    if session_id in _CHECKED:
        return
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    probe = F.udf(_server_python, StringType())
    try:
        spark.range(1).select(probe().alias("where")).collect()
    except Exception as exc:
        text = str(exc)
        if "onceflow" in text and ("ModuleNotFoundError" in text or "No module named" in text):
            conf = _setting(spark, "spark.pyspark.python")
            also = f"; its spark.pyspark.python is {conf}, best the same" if conf else ""
            raise ConfigError("the Spark Connect server's Python cannot import onceflow: the foreachBatch "
                              "function and onceflow's data sources run there. Install it (pip install "
                              "onceflow, the same version as this client) into the interpreter the server "
                              "runs a client's functions with: the server's environment's PYSPARK_PYTHON "
                              f"(else PYSPARK_DRIVER_PYTHON, else python3 on its PATH){also}; "
                              "docs/connect.md") from None
        raise
    _CHECKED.add(session_id)


def _setting(spark: Any, key: str) -> str | None:
    """The server's setting ``key`` as the session reads it (None: unset or not readable)."""
    try:
        value = spark.conf.get(key, None)
    except Exception:  # noqa: BLE001 - a setting a client may not read
        return None
    return None if value is None else str(value)


def sees_checkpoint(spark: Any, checkpoint: Path) -> bool:
    """Whether this client and the Connect server's driver see the same checkpoint directory.

    Yes when the client sees its ``metadata`` (the checkpoint of a query that ran). Else (a new
    checkpoint, or one only the server has) a probe: the client writes a one-byte file
    ``onceflow-probe-<uuid>`` into the directory and the server's driver looks for it (it
    analyses a ``binaryFile`` read of that path, which lists it: no Spark job runs, a missing
    path is Spark's ``PATH_NOT_FOUND``); the file is removed, and so are the
    directories the client made for it when the server did not see it. A directory the client
    cannot write is not seen.
    """
    if (checkpoint / "metadata").exists():
        return True
    made = [p for p in (checkpoint, *checkpoint.parents) if not p.exists()]
    probe = checkpoint / f"onceflow-probe-{uuid.uuid4().hex}"
    try:
        checkpoint.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"?")
    except OSError:
        return False
    seen = False
    try:
        seen = bool(spark.read.format("binaryFile").load(str(probe)).schema.fields)
    except Exception as exc:  # noqa: BLE001 - Spark says PATH_NOT_FOUND as an AnalysisException
        if "PATH_NOT_FOUND" not in str(exc) and "does not exist" not in str(exc):
            raise
    finally:
        probe.unlink(missing_ok=True)
        for directory in made if not seen else []:  # the deepest first
            with contextlib.suppress(OSError):
                directory.rmdir()
    return seen


def start_local(spark: Any, start: Callable[[], Any], wait_s: float = 10.0) -> Any:
    """Start a query whose checkpoint both sides see, its files written through Hadoop's FileSystem API.

    When the session names no checkpoint file manager (a server without onceflow's, or a
    session not made by :func:`onceflow.session`), Spark's default writes each checkpoint
    file through Hadoop's FileContext API, whose rename on a local file system runs ``readlink``
    in child processes of the server's JVM. A checkpoint the client sees (:func:`sees_checkpoint`)
    is on a local file system of the server, where Spark's ``FileSystemBasedCheckpointFileManager``
    renames with the same atomic ``rename(2)`` (what onceflow's own manager picks for a local
    path). Spark reads the setting when a query is made, from the session, so it is set for this
    start alone:

    1. set :data:`SPARKS_LOCAL_FILES` in the session;
    2. start the query: Spark makes its offset and commit logs and its state stores' settings
       from a copy of the session taken at ``start``;
    3. wait until the query is past initializing (its status), when its sources have made
       their logs from the session itself (at most ``wait_s``; a source made later uses Spark's
       default, the same files);
    4. unset the setting (in ``finally``: a refused start leaves the session as it was).

    A session that names a manager (the server's onceflow class, or the user's choice) is left
    alone. Another query started in this session by other code between 1 and 4 gets the setting
    too; onceflow's own starts take turns (a lock).

    Args:
        spark: The client's session.
        start: Starts the query (``DataStreamWriter.start``) and returns it.
        wait_s: How long step 3 waits at most.

    Returns:
        What ``start`` returned.
    """
    from onceflow.runtime.jvmparts import CHECKPOINT_FILES_KEY

    with _STARTING:
        if spark.conf.get(CHECKPOINT_FILES_KEY, None):
            return start()
        spark.conf.set(CHECKPOINT_FILES_KEY, SPARKS_LOCAL_FILES)
        try:
            query = start()
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                try:
                    said = str(query.status.get("message", ""))
                except Exception:  # noqa: BLE001 - a query that ended is past initializing
                    break
                if not said.startswith("Initializing"):
                    break
                time.sleep(0.01)
        finally:
            spark.conf.unset(CHECKPOINT_FILES_KEY)
    return query


def remote_session(url: str, shuffle_partitions: int | None = None, conf: dict[str, str] | None = None,
                   id_store: bool | None = None) -> SparkSession:
    """A Spark Connect session with onceflow's session settings, as far as a client can set them.

    UTC session time and ``conf`` are set on the session; onceflow's id state store and local
    checkpoint file manager are named when the server has their jars (:func:`server_has`),
    else Spark's own run, said in one line each (docs/connect.md: how a server admin installs them).
    The server's Python must import onceflow (:func:`check_server`).

    Args:
        url: The server, ``sc://host:port``.
        shuffle_partitions: ``spark.sql.shuffle.partitions`` (the server's default when omitted).
        conf: Session settings; one a Connect client cannot set is an error naming it.
        id_store: As in :func:`onceflow.session`; ``True`` with a server without the jar is an error.

    Raises:
        ConfigError: A setting the server refuses from a client, ``id_store=True`` on a server
            without the id store, or a server whose Python lacks onceflow.
    """
    from pyspark.sql import SparkSession

    from onceflow.runtime import idstore
    from onceflow.runtime.jvmparts import CHECKPOINT_FILES_CLASS, CHECKPOINT_FILES_KEY

    spark = SparkSession.builder.remote(url).getOrCreate()
    wanted = {"spark.sql.session.timeZone": "UTC", **(dict(conf or {}))}
    if shuffle_partitions:
        wanted["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    use_ids = id_store if id_store is not None else (idstore.enabled_by_env()
                                                     and idstore.PROVIDER_KEY not in wanted)
    if use_ids:
        if server_has(spark, idstore.PROVIDER_CLASS):
            wanted[idstore.PROVIDER_KEY] = idstore.PROVIDER_CLASS
        elif id_store:
            raise ConfigError(f"id_store=True: the Spark Connect server at {url} does not have onceflow's id "
                              "state store (its jar on the server's class path: docs/connect.md)")
        else:
            _log.warning(
                "the Spark Connect server at %s lacks onceflow's id state store: Spark's state store runs "
                "(a server admin installs it: docs/connect.md)", url)
    if CHECKPOINT_FILES_KEY not in wanted:
        if server_has(spark, CHECKPOINT_FILES_CLASS):
            wanted[CHECKPOINT_FILES_KEY] = CHECKPOINT_FILES_CLASS
        else:
            _log.warning(
                "the Spark Connect server at %s lacks onceflow's checkpoint file manager: Spark's runs "
                "(the same files; a checkpoint this client sees: Spark's FileSystem-based one for the "
                "query; docs/connect.md)", url)
    for key, value in wanted.items():
        try:
            spark.conf.set(key, value)
        except Exception as exc:  # noqa: BLE001 - a static or server-only setting
            raise ConfigError(f"{key}={value}: the Spark Connect server refuses it from a client "
                              f"({str(exc).splitlines()[0][:200]}); set it on the server") from None
    check_server(spark)
    return spark


SERVER_WAIT_ENV = "ONCEFLOW_CONNECT_SERVER_WAIT"
"""Seconds a waiting client gives a Connect server that stopped answering (default 60)."""

DEFAULT_SERVER_WAIT_S = 60.0

AFTER_LOSS_S = 1.0
"""How long a call retries a server once a wait found it gone (:func:`bounded_retries`)."""


def server_wait_s(given: float | None = None) -> float:
    """Seconds to wait for a server that stopped answering: ``given``, else the environment's, else 60.

    Raises:
        ConfigError: The value is not a positive number of seconds.
    """
    raw: Any = given if given is not None else os.environ.get(SERVER_WAIT_ENV, DEFAULT_SERVER_WAIT_S)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not value > 0:
        where = "server_wait" if given is not None else f"${SERVER_WAIT_ENV}"
        raise ConfigError(f"{where}={raw!r}: the seconds to wait for a Spark Connect server that stopped "
                          "answering must be a positive number (e.g. 60)")
    return value


def _deadline_policy(policy: Any, seconds: float) -> Any:
    """``policy`` (one of the client's retry policies) whose retries of one call end after ``seconds``.

    The bound is the returned policy's ``seconds`` attribute, read at every retry: lowering it
    shortens the calls retrying at that moment too.
    """
    from pyspark.sql.connect.client.retries import RetryPolicy, RetryPolicyState

    class _State(RetryPolicyState):
        def __init__(self, outer: Any) -> None:
            super().__init__(outer)
            self._outer = outer
            self._inner = policy.to_state()
            self._since: float | None = None

        def next_attempt(self, exception: BaseException | None = None) -> int | None:
            now = time.monotonic()
            self._since = now if self._since is None else self._since
            left_ms = (self._since + self._outer.seconds - now) * 1000
            wait = self._inner.next_attempt(exception)
            if wait is None or left_ms <= 0:
                return None
            return int(min(wait, left_ms))

    class _Deadline(RetryPolicy):
        def can_retry(self, exception: BaseException) -> bool:
            return bool(policy.can_retry(exception))

        def to_state(self) -> RetryPolicyState:
            return _State(self)

    bounded = _Deadline(max_retries=policy.max_retries)
    bounded.seconds = seconds  # type: ignore[attr-defined]
    bounded._name = f"{policy.name} (onceflow: bounded)"
    return bounded


@contextlib.contextmanager
def bounded_retries(spark: Any, seconds: float) -> Iterator[None]:
    """While inside: each call of ``spark``'s Connect client stops retrying after ``seconds``.

    Runs on the client, once per wait of a query. The client's policies decide what is retried
    and how long to sleep, as before; only their total is bounded. The policies are given back
    on the way out — unless the server was found gone: then each call retries for
    :data:`AFTER_LOSS_S` at most, so that the client's own background calls to the gone server
    (the release of an execution, a query listener's stream) end at once instead of keeping the
    process alive for Spark's ten minutes; the session still works with a server that is back
    at its address (one that answers needs no retries).

    Args:
        spark: A Spark Connect session.
        seconds: The longest a call waits for a server that does not answer.
    """
    client = spark.client
    before = client.get_retry_policies()
    bounded = [_deadline_policy(p, seconds) for p in before]
    client.set_retry_policies(bounded)
    try:
        yield
    except BaseException as exc:
        if is_server_gone(exc):  # kept, shorter: the calls retrying now end too
            for p in bounded:
                p.seconds = AFTER_LOSS_S
        else:
            client.set_retry_policies(before)
        raise
    client.set_retry_policies(before)


def server_url(spark: Any) -> str:
    """The ``sc://host:port`` of a Connect session's server (as its client reaches it)."""
    builder = getattr(spark.client, "_builder", None)
    url = getattr(builder, "url", None)
    host, port = getattr(url, "hostname", None), getattr(builder, "_port", None)
    return f"the Spark Connect server sc://{host}:{port}" if host else "the Spark Connect server"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes and contexts, each once."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        yield cause
        cause = cause.__cause__ or cause.__context__


def _grpc_status(exc: BaseException) -> tuple[str, str] | None:
    """(status name, details) of the first gRPC error in ``exc``'s chain."""
    for cause in _chain(exc):
        code, details = getattr(cause, "code", None), getattr(cause, "details", None)
        if callable(code) and callable(details):
            try:
                return str(getattr(code(), "name", code())), str(details() or "")
            except Exception:  # noqa: BLE001 - not a gRPC error after all
                continue
    return None


def is_server_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says the Connect server cannot be reached (gRPC ``UNAVAILABLE``)."""
    status = _grpc_status(exc)
    if status is not None:
        return status[0] == "UNAVAILABLE"
    return any("StatusCode.UNAVAILABLE" in f"{getattr(c, '_grpc_status_code', '')} {c}" for c in _chain(exc))


def server_lost(spark: Any, seconds: float, exc: BaseException) -> ServerLostError:
    """The error a waiting client raises when its server stopped answering (see the module, 5)."""
    status = _grpc_status(exc)
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    said = f"{status[0]}: {status[1]}" if status else first
    return ServerLostError(
        f"{server_url(spark)} has not answered for {seconds:g} s ({said[:200]}): the query ran on that "
        "server and stopped with it. Its checkpoint and sinks agree on every committed batch: start "
        "the server again and run this pipeline again; it resumes exactly where it stopped. To wait "
        f"longer for a server that restarts: awaitTermination(server_wait=SECONDS) or ${SERVER_WAIT_ENV}")
