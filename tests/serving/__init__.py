"""Tests of kgreasoner.serving (a package, so test modules can import the conftest constants)."""
