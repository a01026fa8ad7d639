"""Unit tests of transcoding."""
