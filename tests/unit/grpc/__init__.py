"""Unit tests of kserve_v2/grpc."""
