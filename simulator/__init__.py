"""The simulator: cost profiles, acceptance models, Gymnasium environments, and the verification LP."""
