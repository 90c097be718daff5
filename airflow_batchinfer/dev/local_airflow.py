"""The demo's :class:`~airflow_batchinfer.dev.airflow.DevAirflow` plus what only tests (and the Airflow
benchmarks) do to it: fast failure detection, one component killed, restarted or started again, the
processes of a running task instance, a task instance's log files, a DAG run cleared."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from airflow_batchinfer.dev.airflow import DevAirflow

_ATTEMPT = re.compile(r"attempt=(\d+)\.log")  # a try's task log (not its ``.trigger.N.log``)
PRELOADED = "airflow_batchinfer.dev.preloaded"  # preload=True's executor module (imported by Airflow)


@dataclass
class LocalAirflow(DevAirflow):
    """:class:`DevAirflow` with controls for tests. :param failure_timeout_s: how soon Airflow gives up
    on a silent process: a task without heartbeat for this long is failed (then retried), a scheduler
    or triggerer job without heartbeat is considered dead (its tasks adopted, its triggers reassigned);
    heartbeats and checks run at a fifth of it. 0 keeps Airflow's defaults (300 s for tasks, 30 s for
    jobs). :param preload: run tasks on :class:`airflow_batchinfer.dev.preloaded.LocalExecutor`, whose
    task processes start with the package's DAG-building modules imported (the test suite's: half a
    CPU second less per task); off, each task imports them, as in a deployment (the benchmarks)."""

    failure_timeout_s: int = 0
    preload: bool = False

    def environ(self, component: str | None = None) -> dict[str, str]:
        executor = {"AIRFLOW__CORE__EXECUTOR": f"{PRELOADED}.LocalExecutor"} if self.preload else {}
        return {**super().environ(component), **executor, **self._failure_detection(), **self.env}

    def _failure_detection(self) -> dict[str, str]:
        t = int(self.failure_timeout_s)
        if t <= 0:
            return {}
        tick = str(max(1, t // 5))
        return {
            # a task whose supervisor stopped heartbeating (killed, host lost) is failed, then retried
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(t),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": tick,
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": tick,
            # a scheduler that died: the next one fails its job and adopts or resets its tasks
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": str(t),
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": tick,
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": tick,
            # a triggerer that died: its triggers go to the next triggerer
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": str(t),
        }

    def workdir(self, component: str) -> Path | None:
        """The working directory of ``component`` (``None``: this process's)."""
        return None

    def _spawn(self, name: str, *, cwd: Path | None = None) -> None:
        super()._spawn(name, cwd=cwd or self.workdir(name))

    # ------------------------------------------------------------------------ one component
    def pid(self, component: str) -> int:
        """The PID of a running component (``api-server``, ``scheduler``, ``dag-processor``,
        ``triggerer``)."""
        proc = self.procs.get(component)
        if proc is None or proc.poll() is not None:
            raise RuntimeError(f"airflow {component} is not running")
        return proc.pid

    def kill(
        self, component: str, sig: int = signal.SIGKILL, *, group: bool = True, timeout_s: float = 60
    ) -> int:
        """Signal one component and wait until it has exited; returns its exit code. ``group`` signals
        its whole process group (the scheduler's executor workers and the task processes they run
        die with it, as on a lost host); else only the component's own process."""
        proc = self.procs.get(component)
        if proc is None:
            raise RuntimeError(f"airflow {component} was not started here")
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait(10)

    def start_component(self, component: str, timeout_s: float = 120) -> int:
        """Start one component again (after :meth:`kill`); returns its PID."""
        if component not in self.components:
            raise ValueError(f"unknown component {component!r}: one of {sorted(self.components)}")
        proc = self.procs.get(component)
        if proc is not None and proc.poll() is None:
            raise RuntimeError(f"airflow {component} is still running (pid {proc.pid})")
        self._spawn(component)
        if component == "api-server":
            self._token = None
            self._wait(lambda: self._healthy(), timeout_s, "the api-server to answer")
        return self.procs[component].pid

    def restart(
        self, component: str, sig: int = signal.SIGKILL, *, down_s: float = 0.0, group: bool = True
    ) -> tuple[int, int]:
        """Kill one component with ``sig``, leave it down ``down_s`` seconds, start it again;
        returns (old PID, new PID)."""
        old = self.pid(component)
        self.kill(component, sig, group=group)
        if down_s > 0:
            time.sleep(down_s)
        return old, self.start_component(component)

    def descendants(self) -> dict[int, int]:
        """Every live process below the components this instance started: PID -> parent PID."""
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stat = (entry / "stat").read_text()
                    parents[int(entry.name)] = int(stat.rsplit(") ", 1)[1].split()[1])
        mine = {p.pid for p in self.procs.values() if p.poll() is None}
        found: dict[int, int] = {}
        grew = True
        while grew:
            grew = False
            for pid, ppid in parents.items():
                if pid not in found and (ppid in mine or ppid in found):
                    found[pid] = ppid
                    grew = True
        return found

    def task_processes(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, int]:
        """The processes running one task instance now: ``task`` (the task runner, whose title is
        ``airflow worker -- <ti id>``) and ``supervisor`` (its parent: the executor's worker, which
        heartbeats for it). Only processes below this instance's components are considered.
        Raises ``LookupError`` if the task instance runs nowhere here."""
        ti = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/{map_index}")
        title = f"airflow worker -- {ti['id']}".encode()
        for pid, ppid in self.descendants().items():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").strip() == title:
                    return {"task": pid, "supervisor": ppid, "try_number": int(ti["try_number"])}
        raise LookupError(f"task instance {dag_id}/{run_id}/{task_id}[{map_index}] ({ti['state']}) runs no "
                          "process here")  # fmt: skip

    # ------------------------------------------------------------------------------ task logs
    def attempt_logs(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[int, Path]:
        """The log file of each try of one task instance in the log folder, by try number, in order."""
        base = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        if map_index >= 0:
            base = base / f"map_index={map_index}"
        tries = {int(m.group(1)): p for p in base.glob("attempt=*.log") if (m := _ATTEMPT.fullmatch(p.name))}
        return dict(sorted(tries.items()))

    def task_log(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
        """Every attempt's log of one task instance, oldest first (read from the log folder)."""
        tries = self.attempt_logs(dag_id, run_id, task_id, map_index)
        return "\n".join(path.read_text(errors="replace") for path in tries.values())

    # -------------------------------------------------------------------------------- REST API
    def clear_run(self, dag_id: str, run_id: str, *, only_failed: bool = False) -> list[str]:
        """Re-run a DAG run (the documented remedy after a failure): clear its task instances
        through the REST API; returns the cleared task ids."""
        out = self.api(
            "POST",
            f"/dags/{dag_id}/dagRuns/{run_id}/clear",
            json={"dry_run": False, "only_failed": only_failed},
        )
        return [ti["task_id"] for ti in (out or {}).get("task_instances", [])]
