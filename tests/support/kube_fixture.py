"""A test's view of the session's Kubernetes control plane (the ``kube`` and ``kube_api`` fixtures)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass
class Kube:
    """The session's Kubernetes control plane and kubelet stand-in; ``namespace()`` isolates a test.
    ``kubelet`` is ``None`` for :func:`kube_api` (the API server without pods)."""

    plane: Any
    kubelet: Any
    api: Any

    def namespace(self) -> str:
        from kubernetes import client

        name = f"t-{uuid.uuid4().hex[:8]}"
        core = client.CoreV1Api(self.api)
        core.create_namespace({"metadata": {"name": name}})
        if not self.plane.controllers:  # no controller-manager makes it: pods need it (admission)
            core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
        for _ in range(100):  # pods need the namespace's default ServiceAccount (admission)
            if core.list_namespaced_service_account(name).items:
                return name
            time.sleep(0.1)
        raise TimeoutError(f"namespace {name}: no default ServiceAccount")
