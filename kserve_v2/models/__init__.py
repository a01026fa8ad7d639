"""A loaded model version (``version``) and the lifecycle seam through which the service reads
and drives the repository's models (``lifecycle``)."""
