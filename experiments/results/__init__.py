"""The results page (`specblock results`): docs/results.md generated from the results files, with
the renderer of each results family."""
