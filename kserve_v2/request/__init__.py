"""One inference request in and out: its decoding into model feeds (``decode``), its answer
(``encode``), the classification and shared memory extensions, memory limits (``budget``) and the
pools that take heavy decoding off the event loop (``offload``)."""
