"""One module per `specblock` subcommand; `experiments.cli` loads each only when it is called."""
