"""The simulator: cost profiles, acceptance models, Gymnasium environments, and the verification LP.

Importing it registers the environments ``specblock/SpecLength-v0`` (``simulator.spec_length``),
``specblock/AdaptStream-v0`` (``simulator.adapt_stream``) and ``specblock/SpecServe-v0``
(``simulator.spec_serve``) with Gymnasium, each module holding its environment's single form and its
numpy vector form for ``gym.make_vec(..., vectorization_mode="vector_entry_point")``.
"""

import gymnasium

for _name, _module in (("SpecLength", "spec_length"), ("AdaptStream", "adapt_stream"),
                       ("SpecServe", "spec_serve")):
    if f"specblock/{_name}-v0" not in gymnasium.registry:
        gymnasium.register(id=f"specblock/{_name}-v0", entry_point=f"simulator.{_module}:{_name}Env",
                           vector_entry_point=f"simulator.{_module}:{_name}VectorEnv")
