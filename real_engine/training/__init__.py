"""Offline training of the shipped family, apart from the inference engine: the corpus and its token
windows, the target LM and the draft model (one shared loop), and the feature drafters (SpecBlock,
EAGLE-style, Medusa-style) on the target's cached rows."""
