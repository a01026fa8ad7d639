"""Unit tests of adapters."""
