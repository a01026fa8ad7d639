"""The one request path and its audiences: ``InferenceService`` (the V2 inference RPCs), Triton's
extensions beside inference, the text models of the semantic routes, and streamed responses.
Every transport calls into this package; it imports no transport."""
