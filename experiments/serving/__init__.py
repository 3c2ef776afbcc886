"""Serving (`specblock serve-bench`, `specblock study serving`): the live-against-simulated
benchmark under arrivals, the serving study, and their reports."""
