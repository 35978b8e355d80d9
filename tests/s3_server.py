"""A real S3-compatible HTTP server for tests: moto's server mode, as a subprocess.

It speaks the S3 REST protocol over HTTP, including conditional puts (``If-None-Match``), which
is what delta-rs needs for atomic commits; nothing in the store's code knows it is not AWS.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import boto3

__all__ = ["S3Server", "s3_server"]


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str

    @property
    def storage_options(self) -> dict[str, str]:
        """What ``[use_case.store.storage_options]`` says for this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def uri(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix or uuid.uuid4().hex[:8]}"

    def keys(self, prefix: str = "") -> list[str]:
        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """Start ``moto_server`` on a free port with one bucket; stop it on exit."""
    port = _free_port()
    command = Path(sys.executable).with_name("moto_server")
    process = subprocess.Popen(
        [str(command), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on {endpoint}") from None
                time.sleep(0.1)
        server = S3Server(endpoint, "ldpipe-store")
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket=server.bucket)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
