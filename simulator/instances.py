"""Small autoregressive instances: a target and a drafter over every prefix, stored densely.

An instance is the whole input of the verification problem at tiny scale: vocabulary ``V``, draft
length ``L``, and the next-token laws ``p(.|s)`` and ``q(.|s)`` for every prefix ``s`` of length
``0..L`` (``p`` after ``L`` tokens gives the bonus). The LP, the closed forms and the exact
enumeration of the torch verifiers all read the same object, so they can be compared to 1e-9.

Tables are indexed by prefix code: a prefix ``(t_1, ..., t_m)`` has code ``sum_i t_i V^(m-i)``
(first token most significant), so ``table[m][code]`` is the law after that prefix and
``table[m + 1][code * V + v]`` the law after appending ``v``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from core.errors import InputError

DRAFT_LAWS = ("indep", "mix")  # how random_instance draws the draft laws
MIX_WEIGHT = 0.6  # "mix" drafter: q = MIX_WEIGHT * p + (1 - MIX_WEIGHT) * Dirichlet(1)
TOLERANCE = 1e-9


def check_shape(vocab: int, length: int) -> None:
    """Refuse a vocabulary under 2 tokens or a draft length under 1."""
    if vocab < 2:
        raise InputError(f"vocabulary size {vocab} is too small: use a vocabulary of at least 2 tokens")
    if length < 1:
        raise InputError(f"draft length {length} is too small: use a draft length of at least 1")


def check_distribution(values: Sequence[float] | np.ndarray, name: str,
                       vocab: int | None = None) -> np.ndarray:
    """Return ``values`` as a float64 vector after checking it is a probability vector (of size ``vocab``)."""
    vec = np.asarray(values, dtype=np.float64)
    if vec.ndim != 1:
        raise InputError(f"{name} must be a flat list of probabilities, one per token")
    if vocab is not None and vec.size != vocab:
        raise InputError(f"{name} has {vec.size} entries for a vocabulary of {vocab}: give one per token")
    if not np.all(np.isfinite(vec)) or np.any(vec < 0):
        raise InputError(f"{name} has a negative or non-finite entry: every probability must be >= 0")
    if abs(vec.sum() - 1.0) > TOLERANCE:
        raise InputError(f"{name} sums to {vec.sum():.12g}, not 1: rescale it so the entries sum to 1")
    return vec


@dataclass(frozen=True, eq=False)
class ARInstance:
    """Target and draft next-token laws for every prefix up to the draft length (read-only tables)."""

    vocab: int
    length: int
    p_tables: tuple[np.ndarray, ...]  # p_tables[m]: [V^m, V], the target after each prefix of length m
    q_tables: tuple[np.ndarray, ...]  # q_tables[m]: [V^m, V], the drafter after each prefix of length m

    def __post_init__(self) -> None:
        check_shape(self.vocab, self.length)
        for name, tables in (("p", self.p_tables), ("q", self.q_tables)):
            if len(tables) != self.length + 1:
                raise InputError(f"{name} needs {self.length + 1} tables (prefix lengths 0..{self.length}), "
                                 f"got {len(tables)}")
            for m, table in enumerate(tables):
                if table.shape != (self.vocab**m, self.vocab):
                    raise InputError(f"{name} table {m} has shape {table.shape}: expected "
                                     f"({self.vocab**m}, {self.vocab}), one row per prefix of length {m}")
                if not np.all(np.isfinite(table)) or np.any(table < 0) or \
                        np.max(np.abs(table.sum(axis=1) - 1.0)) > TOLERANCE:
                    raise InputError(f"{name} table {m} has a row that is not a probability vector: "
                                     "entries must be >= 0 and sum to 1")
                table.flags.writeable = False

    def code(self, prefix: Sequence[int]) -> int:
        """Row index of ``prefix`` in the table of its length."""
        code = 0
        for token in prefix:
            if not 0 <= token < self.vocab:
                raise InputError(f"token {token} is outside the vocabulary 0..{self.vocab - 1}")
            code = code * self.vocab + int(token)
        return code

    def p(self, prefix: Sequence[int]) -> np.ndarray:
        """Target law of the next token after ``prefix`` (length 0..L), as a fresh writable array."""
        return self.p_tables[len(prefix)][self.code(prefix)].copy()

    def q(self, prefix: Sequence[int]) -> np.ndarray:
        """Draft law of the next token after ``prefix`` (length 0..L), as a fresh writable array."""
        return self.q_tables[len(prefix)][self.code(prefix)].copy()


def path_probabilities(tables: Sequence[np.ndarray], upto: int) -> list[np.ndarray]:
    """Probability of every string of length ``0..upto`` under the autoregressive law ``tables``."""
    probs = [np.ones(1)]
    for m in range(upto):
        probs.append((probs[m][:, None] * tables[m]).ravel())
    return probs


def random_instance(vocab: int, length: int, rng: np.random.Generator, drafter: str = "indep") -> ARInstance:
    """Dirichlet(1) target laws for every prefix; the drafter is an independent Dirichlet(1) draw
    (``"indep"``) or ``0.6 p + 0.4 Dirichlet(1)`` (``"mix"``, a drafter that partly knows the target)."""
    check_shape(vocab, length)
    if drafter not in DRAFT_LAWS:
        raise InputError(f"unknown drafter kind {drafter!r}: use one of {', '.join(DRAFT_LAWS)}")
    ones = np.ones(vocab)
    p = tuple(rng.dirichlet(ones, size=vocab**m) for m in range(length + 1))
    noise = tuple(rng.dirichlet(ones, size=vocab**m) for m in range(length + 1))
    if drafter == "mix":
        noise = tuple(MIX_WEIGHT * a + (1 - MIX_WEIGHT) * b for a, b in zip(p, noise, strict=True))
    return ARInstance(vocab, length, p, noise)


def step_instance(p_vec: Sequence[float], q_vec: Sequence[float], length: int) -> ARInstance:
    """The same target law ``p_vec`` and draft law ``q_vec`` after every prefix (a memoryless instance)."""
    p = check_distribution(p_vec, "the target distribution")
    check_shape(p.size, length)
    q = check_distribution(q_vec, "the draft distribution", vocab=p.size)
    vocab = p.size
    return ARInstance(vocab, length, tuple(np.tile(p, (vocab**m, 1)) for m in range(length + 1)),
                      tuple(np.tile(q, (vocab**m, 1)) for m in range(length + 1)))
