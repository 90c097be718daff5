"""Reviewers' decisions take effect: when a review gate is answered, the round about to run splits
its pending set (the reviewed round's rejected rows, recompacted) by the decisions on those rows.

- **retry** (every row no decision names): stays pending, in ``round-NN/reviewed/`` (the round's
  pending set from then on: :func:`airflow_batchinfer.run.plan.pending_shards` prefers it); a row
  a retry decision names carries it (``sent_back``: who, when, the note, the round), and its next
  attempt's prompt may read the note (``previous.note``, :mod:`airflow_batchinfer.retries`);
- **accept**: into ``results/`` (``reviewed-rNN-<shard>``), marked ``accepted_by_review`` with
  who, when and the note;
- **drop**: out of the run, into ``dropped/`` with the same record of the decision.

Every output file is written whole and the split's ids are digested per output, so the id invariant
holds from digests: pending = retained + accepted + dropped (the plan records the last two; the
report counts them). Applying again (a retried plan task) rewrites the same files from the same
decisions, and removes what an earlier application wrote that these decisions no longer make.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from airflow_batchinfer.retries import SENT_BACK
from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.decisions import Action, Decision, DecisionLog, Resolver
from airflow_batchinfer.run.config import RunConfig
from airflow_batchinfer.run.layout import SHARD_SUFFIX, RunLayout
from airflow_batchinfer.storage import JsonlDir, JsonlFile, ShardDescriptor, files
from airflow_batchinfer.storage.digest import IdDigest
from airflow_batchinfer.storage.location import StorageOptions, join
from airflow_batchinfer.storage.manifest import write_manifest

APPLIED_VERSION = 1


@dataclass
class Applied:
    """What a round's decisions did to the next round's pending set."""

    reviewed_round: int
    decisions: int
    shards: list[ShardDescriptor]  # the retained rows, per shard (the round's pending set now)
    counts: dict[str, int] = field(default_factory=lambda: {"accept": 0, "retry": 0, "drop": 0})
    accepted: IdDigest = field(default_factory=IdDigest)
    dropped: IdDigest = field(default_factory=IdDigest)

    def to_dict(self) -> dict[str, Any]:
        """What the split's manifest (``run.docs.review_applied``, which the report counts) and the
        plan (``Plan.reviewed``) record."""
        return {
            "version": APPLIED_VERSION,
            "round": self.reviewed_round,
            "decisions": self.decisions,
            "counts": dict(self.counts),
            "accepted": self.accepted.to_dict(),
            "dropped": self.dropped.to_dict(),
        }


def apply_decisions(
    cfg: RunConfig, r: int, pending: list[ShardDescriptor], so: StorageOptions | None = None
) -> Applied | None:
    """Split round ``r``'s ``pending`` shards by the decisions on round ``r - 1``'s rejected rows;
    ``None`` when there are none (nothing is written)."""
    if r < 1:
        return None
    # sealed first: a decision recorded from now on is refused, not silently left out
    decisions = DecisionLog(cfg.run_root, r - 1, so).seal()
    if not decisions:
        return None
    layout = RunLayout(cfg.run_root)
    reviewed = r - 1
    view = RoundView(cfg.run_root, reviewed, so)
    resolver = Resolver(decisions)
    id_field = cfg.id_field or "id"
    applied = Applied(reviewed, len(decisions), [])
    made: set[str] = set()
    retained_dir = JsonlDir(layout.reviewed(r), storage_options=so)
    for shard in pending:
        sid = shard["shard_id"]
        digests: dict[Action, IdDigest] = {a: IdDigest() for a in ("accept", "retry", "drop")}
        uris: dict[Action, str] = {
            "retry": retained_dir.file(sid + SHARD_SUFFIX).uri,
            "accept": layout.review_accepted(reviewed, sid),
            "drop": layout.review_dropped(reviewed, sid),
        }
        with contextlib.ExitStack() as stack:  # a file only for an action that takes rows
            outs: dict[Action, Any] = {}
            for pos, row in enumerate(JsonlFile(shard["uri"], storage_options=so).iter_records()):
                sample = view.to_sample(row, sid, pos, prompt=resolver.needs_prompts)
                decision = resolver.decision(sample)
                action: Action = decision.action if decision is not None else "retry"
                if action not in outs:
                    outs[action] = stack.enter_context(
                        JsonlFile(uris[action], storage_options=so).writer_sync()
                    )
                outs[action].write(_marked(row, decision) if decision is not None else row)
                digests[action].add(row.get(id_field))
                applied.counts[action] += 1
        made.update(uris[a] for a in outs)
        applied.accepted += digests["accept"]
        applied.dropped += digests["drop"]
        if "retry" in outs:
            applied.shards.append(
                {
                    "shard_id": sid,
                    "uri": uris["retry"],
                    "records": digests["retry"].count,
                    "ids": digests["retry"].to_dict(),
                }
            )
    # what an earlier application of these decisions wrote that they no longer make
    prefix = f"reviewed-r{reviewed:02d}-"
    files.remove_others(layout.results, prefix, made, so)
    files.remove_others(layout.dropped, prefix, made, so)
    files.remove_others(retained_dir.uri, "", made | {join(retained_dir.uri, "_manifest.json")}, so)
    write_manifest(
        retained_dir,
        {
            "kind": "review",
            "state": "complete",
            "round": r,
            "reviewed_round": reviewed,
            "decisions": len(decisions),
            "shards": applied.shards,
            "records": applied.counts["retry"],
            "applied": applied.to_dict(),
        },
    )
    return applied


def _marked(row: dict[str, Any], decision: Decision) -> dict[str, Any]:
    """``row`` with the decision on it: an accepted or dropped row's ``review`` (it leaves the run);
    a retried row's ``sent_back`` (who, when, the note, the round reviewed), which its next attempt's
    prompt may read (``previous.note``: :func:`~airflow_batchinfer.retries.previous_of`) and which
    that attempt's row no longer carries (a field of the generation it replaces)."""
    if decision.action == "retry":
        sent_back = {"by": decision.by, "at": decision.at, "note": decision.note, "round": decision.round}
        return {**row, SENT_BACK: sent_back}
    review = {"action": decision.action, "by": decision.by, "at": decision.at, "note": decision.note}
    extra = {"accepted_by_review": True} if decision.action == "accept" else {}
    return {**row, **extra, "review": review}
