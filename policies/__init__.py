"""Speculation-length and adaptation policies, their file format, and the shared observation features.

numpy only: this package imports neither torch nor the engine, so the simulator and the engine can
both depend on it.
"""
