"""The main job (`specblock pipeline`): the plan and its steps, the fidelity study the pipeline
shares with `specblock fidelity`, deployment of the tuned policies, and the report."""
