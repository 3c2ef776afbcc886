"""The `specblock` command, the end-to-end pipeline, Ray Tune studies, benchmarks and reports."""
