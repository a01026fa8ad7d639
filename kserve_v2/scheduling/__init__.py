"""How a model version runs its requests (Triton's schedulers), and the instance group that executes
what they form.

- ``base``: the ``Scheduler`` seam, ``DirectScheduler`` (no batching block), ``Pending``, the inline fast path.
- ``dynamic_batcher``: ``DynamicBatcher``: forms and dispatches batches of queued requests; ``RowBatching``.
- ``priority_queue``: ``PriorityQueue``, where the dynamic batcher's requests wait: levels, queue policies, timeouts.
- ``batch_rows``: tensor rows along the batch dim: batch keys, rows merged, outputs split back per member.
- ``ragged``: ragged batching: batch inputs and outputs, inputs of different shapes merged without padding.
- ``sequence_batcher``: ``SequenceBatcher``: runs each instance's executions of its sequences, in order.
- ``sequence_slots``: where sequences live: correlation id -> instance and slot, backlog, idle expiry.
- ``sequence_rows``: the rows of one sequence batch execution: choice, padding, controls, state (pure).
- ``sequence_config``: ``sequence_batching``, read and checked once when a version loads.
- ``ensemble``: ensembles: checks at load, the step plan, the batch-dim rule between steps.
- ``ensemble_scheduler``: ``EnsembleScheduler``: each needed step a request through the one inference call.
- ``instances``: ``InstancePool``: a version's instances (threads), tiny executions inline, cancellation.
- ``rate_limiter``: Triton's rate limiter: an instance executes once its resources are free.
"""
