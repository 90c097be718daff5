"""The shard jobs a worker runs: ``infer`` (:mod:`.infer`), ``judge`` (:mod:`.judge`),
``infer_judge`` (both in one pass over the shard, :func:`.infer.run_infer_judge`) and ``in_place``
(:mod:`.in_place`); an infer job of a pooling task (``params.task``: embed, classify, score) makes
its rows in :mod:`.pooling`; what a job has (:mod:`.context`) and how its shard streams through it in
chunks (:mod:`.chunks`). The worker's registry maps each kind to its job
(:data:`~airflow_batchinfer.worker.registry.SHARD_JOBS`).

Each job streams its input shard in chunks (memory is bounded by ``concurrency × chunk_size``
records per worker, whatever the shard size), submits prompts to the worker's shared batcher, turns
every per-record failure into a row with a reason, and commits each output file atomically. Output
rows are the input record plus ``result``, ``status``, ``error``, ``judgment``, ``attempts`` and
``round``.

Fencing: a spec with ``outputs["staging"]`` has its outputs (a judge's or in-place job's approved
and rejected rows, an infer job's inferred rows) written under a fresh attempt token
(:meth:`~.context.JobContext.output`), never to their final URIs; the completion manifest names the
attempt and its files (``committed``), a judge reads the infer attempt named there, and the round's
close accepts one attempt of each job.

Accounting: a job counts into its :class:`~airflow_batchinfer.state.tally.Tally` (the manifest's
``counts``: each feature's sub-model, counted in the job module that owns the feature), digests the
ids it reads (``input``) and those of every row it emits per output file
(:data:`~airflow_batchinfer.state.docs.ID_OUTPUTS`); the manifest's ``ids`` carries them, and the
round's close checks the invariant from them without reading rows. Judge, infer_judge and in-place
jobs also count the reason groups of the rows they reject
(:func:`~airflow_batchinfer.judges.reasons.reason_group`), the manifest's ``reason_groups``: the
review page shows a round's groups from them without reading its rows.

Resume inside a shard: an infer, judge or infer_judge spec with ``outputs["segments"]`` commits each
chunk as a segment (:mod:`~airflow_batchinfer.worker.segments`) and assembles its outputs from them
at the end; a later attempt of the job continues after the last committed segment. Without it a job
streams one file per output.
"""
