"""Request rescheduling (Triton's ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``; its python_backend
README, "Request Rescheduling"): a backend hands a request back to the scheduler that ran it, to be
executed again later, with its id, inputs and response stream unchanged.

Triton's core honours the flag only under ``sequence_batching { iterative_sequence: true }`` (its
``IterativeSequencer``: the request goes back to its sequence's slot with the START and END flags
cleared); under any other scheduler releasing a request with it fails with ``NOT_CONFIGURED``.
A backend answers a member of an execution with a ``Rescheduled`` (in place of its ``Execution``
or error) only where the version's configuration allows it; the sequence batcher queues it again.
"""

from __future__ import annotations

# Triton's core text (infer_request.cc) for the flag under a scheduler that does not reschedule: INVALID_ARGUMENT
NOT_CONFIGURED = ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
                  "configured to handle such a flag.")


class Rescheduled(Exception):
    """A member of an execution that its backend gave back to be executed again (see the module
    docstring): its scheduler queues it once more instead of answering it."""
