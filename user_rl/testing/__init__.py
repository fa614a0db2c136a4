"""Test and benchmark helpers that stand in for hostile networks and devices."""
