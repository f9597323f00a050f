"""Tests of the block transport (transfer/)."""
