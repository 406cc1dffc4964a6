"""A local Spark session started ahead of need: the JVM launched at once, the rest built meanwhile.

A cold `wire tick` spent ~2 s on imports, Dagster's definitions, the sensor and the run's creation,
then ~4.6 s starting its JVM, one after the other (issue 26). `Ahead(opts)` launches the JVM from
the calling thread at once: PySpark launches it with a `preexec_fn` (Python run in the forked
child), and forked from a helper thread that child died of SIGSEGV (`sparksession.started_session`),
so the caller must be the main thread. A helper thread then connects to the JVM and builds the
context, the session and the session's Python workers while the caller goes on; `session()` waits
for them.

The launch is PySpark's own (`pyspark.java_gateway.launch_gateway`, PySpark 4.3) cut in two, so
that its wait for the JVM's answer is not the caller's: the same spark-submit command, environment,
connection file and gateway. Nothing else differs from `SparkSession.builder.getOrCreate()`: the
context is made with the same configuration, through PySpark's `SparkContext(conf, gateway)`.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

S = TypeVar("S")


def _ignore_sigint() -> None:  # PySpark's: Ctrl-C on the terminal is the driver's to handle, not the JVM's
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _spark_submit() -> str:
    """PySpark's: SPARK_HOME's, else the wheel's (found without importing pyspark: the caller's
    thread only launches)."""
    from .sparkconf import spark_home

    return os.path.join(os.environ.get("SPARK_HOME") or spark_home(), "bin", "spark-submit")


class Ahead(Generic[S]):
    """A local session under way: the JVM of configuration `opts` launched by the constructor (in
    the calling thread, with environment `env`); its gateway and context built on a helper thread,
    then `make()` (the session, which finds that context) and `warm(session)` run there."""

    def __init__(
        self,
        opts: Mapping[str, str],
        env: Mapping[str, str],
        make: Callable[[], S],
        warm: Callable[[S], None],
    ) -> None:
        self._opts = dict(opts)
        command = [_spark_submit()]
        for k, v in self._opts.items():
            command += ["--conf", f"{k}={v}"]
        command += shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell"))
        # The JVM's connection file, in this process's own JVM directory (`spark.local.dir`, made by
        # sparksession._jvm_tmpdir): a command killed before the JVM wrote it leaves the directory
        # to the sweep of the next session's start, not in /tmp for good.
        self._dir = tempfile.mkdtemp(prefix="gateway-", dir=self._opts.get("spark.local.dir"))
        self._info = os.path.join(self._dir, "conn")
        full = {**env, "SPARK_CONNECT_MODE": "0", "_PYSPARK_DRIVER_CONN_INFO_PATH": self._info}
        # stdin a pipe: the JVM ends when it closes, i.e. when this process does, however it ends.
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, env=full, preexec_fn=_ignore_sigint)
        self._session: S | None = None
        self._error: BaseException | None = None
        self._taken = False
        self._make, self._warm = make, warm
        self._thread = threading.Thread(target=self._build, name="wire-spark-ahead", daemon=True)
        self._thread.start()

    def _gateway(self):
        """PySpark's `launch_gateway` after its Popen: wait for the JVM's connection file, connect."""
        from py4j.clientserver import ClientServer, JavaParameters, PythonParameters
        from py4j.java_gateway import GatewayParameters, JavaGateway, java_import
        from pyspark.errors import PySparkRuntimeError
        from pyspark.serializers import UTF8Deserializer, read_int

        try:
            while self.proc.poll() is None and not os.path.isfile(self._info):
                time.sleep(0.02)
            if not os.path.isfile(self._info):
                raise PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})
            with open(self._info, "rb") as info:
                port = read_int(info)
                secret = UTF8Deserializer().loads(info)
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
        if os.environ.get("PYSPARK_PIN_THREAD", "true").lower() == "true":
            gateway = ClientServer(
                java_parameters=JavaParameters(port=port, auth_token=secret, auto_convert=True),
                python_parameters=PythonParameters(port=0, eager_load=False),
            )
        else:
            gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port, auth_token=secret, auto_convert=True))
        for name in _JAVA_IMPORTS:
            java_import(gateway.jvm, name)
        return gateway

    def _build(self) -> None:
        try:
            from pyspark.conf import SparkConf
            from pyspark.core.context import SparkContext

            gateway = self._gateway()
            conf = SparkConf(loadDefaults=False).setAll(list(self._opts.items()))
            SparkContext(conf=conf, gateway=gateway)  # the context `getOrCreate` finds
            session = self._make()
        except BaseException as e:  # session() raises it in the caller's thread
            self._error = e
            return
        try:
            self._warm(session)
        except Exception as e:  # the caller's first job meets (and reports) whatever failed here
            logging.getLogger(__name__).debug("warming the Python workers failed: %s", e)
        self._session = session

    def session(self) -> S:
        """The session, once built and warm (waiting for it). What failed on the way is raised here,
        as `SparkSession.builder.getOrCreate()` raises it, the JVM stopped first."""
        self._thread.join()
        if self._error is not None:
            self._kill()
            raise self._error
        assert self._session is not None  # built, since nothing failed
        self._taken = True
        return self._session

    def stop(self) -> None:
        """End the JVM unless its session was handed out (a tick that had nothing to compute)."""
        if not self._taken:
            self._kill()

    def _kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # by its process id: this process's child
            self.proc.wait()


#: The classes `launch_gateway` imports into the gateway's JVM view (PySpark 4.3).
_JAVA_IMPORTS = (
    "org.apache.spark.SparkConf",
    "org.apache.spark.api.java.*",
    "org.apache.spark.api.python.*",
    "org.apache.spark.ml.python.*",
    "org.apache.spark.mllib.api.python.*",
    "org.apache.spark.resource.*",
    "org.apache.spark.sql.Encoders",
    "org.apache.spark.sql.OnSuccessCall",
    "org.apache.spark.sql.functions",
    "org.apache.spark.sql.classic.*",
    "org.apache.spark.sql.api.python.*",
    "org.apache.spark.sql.hive.*",
    "scala.Tuple2",
)
