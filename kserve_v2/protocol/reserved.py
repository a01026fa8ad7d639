"""The request parameters Triton's extensions of the V2 protocol keep for themselves, and Triton's
texts that more than one layer answers with.

One definition, three views of it:

- ``SEQUENCE_PARAMETERS``: ``sequence_id``, ``sequence_start``, ``sequence_end`` (the sequence
  extension, ``protocol/extension_sequence.md``): a request's correlation id and flags.
- ``SCHEDULING_PARAMETERS``: those and ``priority``, ``timeout`` (the schedule-policy extension,
  ``protocol/extension_schedule_policy.md``): what Triton's front ends turn into the request's own
  scheduling fields; a model never reads them as parameters.
- ``RESERVED_PARAMETERS``: those, ``headers`` (reserved by the parameters extension,
  ``protocol/extension_parameters.md``) and ``binary_data_output`` (the binary tensor data
  extension's, ``protocol/extension_binary_data.md``): the names tritonclient refuses as a custom
  parameter; they never tell two requests' batches apart.
"""

from __future__ import annotations

SEQUENCE_ID, SEQUENCE_START, SEQUENCE_END = "sequence_id", "sequence_start", "sequence_end"
PRIORITY, TIMEOUT = "priority", "timeout"
HEADERS, BINARY_DATA_OUTPUT = "headers", "binary_data_output"

SEQUENCE_PARAMETERS = frozenset({SEQUENCE_ID, SEQUENCE_START, SEQUENCE_END})
SCHEDULING_PARAMETERS = SEQUENCE_PARAMETERS | {PRIORITY, TIMEOUT}
RESERVED_PARAMETERS = SCHEDULING_PARAMETERS | {HEADERS, BINARY_DATA_OUTPUT}

# Triton's text for a request whose timeout passed before it ran (a queue policy's REJECT, a BLS request's timeout)
TIMEOUT_EXPIRED = "Request timeout expired"
