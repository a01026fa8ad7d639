"""How a model version runs its requests (Triton's schedulers): the scheduler seam (``base``),
the dynamic batcher, the sequence batcher, the ensemble scheduler, and the instance group that
executes what they form."""
