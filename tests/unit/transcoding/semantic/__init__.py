"""Unit tests of transcoding/semantic."""
