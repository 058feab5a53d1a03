"""Fakes of the external systems capwatch talks to, shared by the tests."""
