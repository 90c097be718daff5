"""What differs between the Airflow versions the provider supports (pyproject.toml's ``airflow``
extra; ``make test-floor`` runs the lowest of them, docs/testing.md).

- ``AirflowFailException`` and ``AirflowNotFoundException`` are in ``airflow.sdk.exceptions`` from
  task SDK 1.2 (Airflow 3.2); Airflow 3.1 has them in ``airflow.exceptions`` only. Operators import
  them from here, which imports them on first use: this module imports no Airflow.
- The review desk (:mod:`airflow_batchinfer.plugin.desk`) needs Airflow :data:`REVIEW_DESK_AIRFLOW`
  (HITL tasks waiting in ``awaiting_input``, the auth manager's HITL checks):
  :func:`review_desk_unavailable` says why it is off on an older one, and the plugin then shows
  neither its tab nor its Browse entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException

__all__ = [
    "REVIEW_DESK_AIRFLOW",
    "AirflowFailException",
    "AirflowNotFoundException",
    "airflow_version",
    "review_desk_unavailable",
]

REVIEW_DESK_AIRFLOW = "3.3.0"
_EXCEPTIONS = ("AirflowFailException", "AirflowNotFoundException")


def __getattr__(name: str) -> Any:
    """The Airflow exceptions, imported on first use: importing this module imports no Airflow (it is
    a base module, below the Airflow layer)."""
    if name not in _EXCEPTIONS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from airflow.sdk import exceptions as sdk

    if hasattr(sdk, name):
        return getattr(sdk, name)
    from airflow import exceptions as core  # task SDK 1.1 (Airflow 3.1): Airflow core's only

    return getattr(core, name)


def airflow_version() -> str:
    from airflow import __version__

    return str(__version__)


def review_desk_unavailable(version: str | None = None) -> str | None:
    """Why the review desk is off on this Airflow (``version``: the installed one), or ``None``."""
    from packaging.version import Version

    version = version or airflow_version()
    if Version(Version(version).base_version) >= Version(REVIEW_DESK_AIRFLOW):  # 3.3, 3.3.0rc1: on
        return None
    return (
        f"the review desk needs Airflow {REVIEW_DESK_AIRFLOW} or later and this is Airflow {version}: "
        "no Review desk tab or Browse entry, /batchinfer is not served. Answer review gates on the "
        "Required Actions page (docs/review.md)."
    )
