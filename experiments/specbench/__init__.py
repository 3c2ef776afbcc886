"""The Spec-Bench-style decoding benchmark (`specblock bench`, not `specblock benchmark NAME`,
which runs a module of `benchmarks/`): the run, its report, the transformers peer, and the shapes
sweep (`specblock shapes`)."""
