"""Drafters behind one protocol: each proposes a draft tree for the decode loop to verify."""
