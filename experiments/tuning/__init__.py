"""Tuning policies in the simulator with Ray Tune (`specblock tune`, `specblock study`): the studies,
the tuning runs, and the shared Ray session."""
