"""Live online adaptation (`specblock adapt-live`): the stream plan, the live run, the simulator's
prediction of it, the serving of a stream, and its report."""
