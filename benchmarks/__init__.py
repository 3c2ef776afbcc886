"""The benchmarks behind ``benchmarks/results``: one module per `specblock benchmark NAME`, each defining a
click command called `command` (``experiments.commands.benchmark`` lists them)."""
