"""Unit tests of transcoding/v2."""
