"""One inference request in and out, transport-free.

- ``decode``: ModelInferRequest -> validated model feeds; remembered request signatures.
- ``encode``: model outputs -> ModelInferResponse (raw contents, shared memory, parameters).
- ``input_order``: the order Triton's core checks inputs in, so errors name the input Triton names.
- ``classification``: Triton's classification extension: an output as its top classes.
- ``shared_memory``: Triton's system shared memory extension: registered regions.
- ``budget``: request memory: a request's decoded cost, the per-request limit, the in-flight pool.
- ``offload``: heavy decoding and encoding off the event loop (threads, a JSON worker process).
- ``forwarded_headers``: Triton's header forward patterns: request headers as request parameters.
"""
