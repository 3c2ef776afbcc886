"""The simulator: cost profiles, acceptance models, Gymnasium environments, and the verification LP.

Importing it registers the environments ``specblock/SpecLength-v0``, ``specblock/AdaptStream-v0`` and
``specblock/SpecServe-v0`` with Gymnasium, each with a numpy vector form for ``gym.make_vec(...,
vectorization_mode="vector_entry_point")``.
"""

import gymnasium

for _name, _single, _vector in (("SpecLength-v0", "envs:SpecLengthEnv", "SpecLengthVectorEnv"),
                                ("AdaptStream-v0", "adapt_stream:AdaptStreamEnv", "AdaptStreamVectorEnv"),
                                ("SpecServe-v0", "serve:SpecServeEnv", "SpecServeVectorEnv")):
    if f"specblock/{_name}" not in gymnasium.registry:
        gymnasium.register(id=f"specblock/{_name}", entry_point=f"simulator.{_single}",
                           vector_entry_point=f"simulator.vector_envs:{_vector}")
