"""Tests of the peer block server and the HiCache peer storage backend."""
