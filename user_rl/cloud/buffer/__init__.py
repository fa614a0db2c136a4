"""Persistent replay buffer: sealed column segments on disk, indexed by a durable commit log."""
