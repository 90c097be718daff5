"""The repository's Kubernetes manifests (k8s/), read and rendered for the manifest tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"


def base_docs() -> list[dict[str, Any]]:
    files = ("worker.yaml", "rbac.yaml", "reaper.yaml", "networkpolicy.yaml")
    return [d for f in files for d in load_all((K8S / "base" / f).read_text())]


def rendered(tmp_path: Path) -> dict[str, list[dict[str, Any]]]:
    """The overlays as ``kubectl kustomize`` renders them (with a token file, as a user writes it);
    empty without kubectl."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return {}
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    out = {}
    for overlay in ("gpu", "cpu-demo", "model-cache"):  # model-cache builds on gpu (its token.env)
        if overlay != "model-cache":
            (tree / "overlays" / overlay / "token.env").write_text("token=" + "t" * 32 + "\n")
        res = subprocess.run(
            [kubectl, "kustomize", str(tree / "overlays" / overlay)], capture_output=True, text=True
        )
        assert res.returncode == 0, res.stderr
        out[overlay] = load_all(res.stdout)
    return out


def load_all(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]
