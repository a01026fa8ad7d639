"""Unit tests of transcoding/http."""
