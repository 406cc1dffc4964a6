"""Dagster resources: the object store and the Spark session.

Secrets come from the environment through `dg.EnvVar` and are resolved when a
resource initialises, never at import time. `dagster-aws`'s S3 resource is not
used: it hands out a raw boto3 client, while Wire needs its own retrying client
with typed create-if-absent errors (the commit protocol rests on it).
`dagster-pyspark`'s PySparkResource builds a classic session from a config dict
only; Wire's session factory also attaches to Spark Connect (`WIRE_SPARK_REMOTE`),
so the Spark resource wraps that factory instead.

`wire_io_manager` (io_manager.py) loads a window's committed rows into downstream assets.
"""

import dagster as dg
from pydantic import Field

from wire_dagster.objectstore import ObjectStore, S3Config

from .io_manager import IO_MANAGER_KEY, WireIOManager

__all__ = ["IO_MANAGER_KEY", "ObjectStoreResource", "SparkResource", "WireIOManager", "default_resources"]


class ObjectStoreResource(dg.ConfigurableResource):
    """The S3-compatible object store (MinIO in production, SeaweedFS embedded)."""

    endpoint: str = Field(description="S3 endpoint URL, e.g. http://127.0.0.1:9000 (WIRE_S3_ENDPOINT)")
    access_key: str = Field(description="Access key (WIRE_S3_ACCESS_KEY)")
    secret_key: str = Field(description="Secret key (WIRE_S3_SECRET_KEY); never logged")
    bucket: str | None = Field(default=None, description="Bucket; default WIRE_S3_BUCKET, else wire")

    def get_store(self) -> ObjectStore:
        import os

        bucket = self.bucket or os.environ.get("WIRE_S3_BUCKET") or "wire"
        return ObjectStore(
            S3Config(endpoint=self.endpoint, access_key=self.access_key, secret_key=self.secret_key, bucket=bucket)
        )


class SparkResource(dg.ConfigurableResource):
    """A Spark session: Spark Connect if `remote` (or WIRE_SPARK_REMOTE), else `master`
    (or WIRE_SPARK_MASTER, default local[*]). In one process, the session is reused."""

    master: str | None = Field(default=None, description="spark://host:port or local[*]; default WIRE_SPARK_MASTER")
    remote: str | None = Field(default=None, description="sc://host:port; default WIRE_SPARK_REMOTE")

    def get_session(self):
        from wire_dagster.sparksession import get_spark

        return get_spark(master=self.master or None, remote=self.remote or None, app="wire-dagster")


def default_resources() -> dict:
    """Resources wired to the environment (resolved when they initialise)."""
    store = ObjectStoreResource(
        endpoint=dg.EnvVar("WIRE_S3_ENDPOINT"),
        access_key=dg.EnvVar("WIRE_S3_ACCESS_KEY"),
        secret_key=dg.EnvVar("WIRE_S3_SECRET_KEY"),
    )
    return {"wire_store": store, "wire_spark": SparkResource(), IO_MANAGER_KEY: WireIOManager(store=store)}
