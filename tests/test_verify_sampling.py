"""The verifiers, driven by the real TorchSampler on drafts drawn from ``q``, emit text distributed as the
target: each emitted string, completed by sampling from ``p``, follows the product of ``p``'s rows, a law
computed here from the instance alone (no verifier code). Thousands of seeded calls per verifier and child
rule; a chi-square test must accept the target's law and reject the draft's (so the check has power)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from real_engine import exact
from real_engine.verify import VERIFIERS, TorchSampler

VOCAB, LENGTH, CALLS = 3, 2, 3000
STRINGS = list(itertools.product(range(VOCAB), repeat=LENGTH + 1))


class Table:
    """Random Dirichlet ``p`` and ``q`` after every prefix; at the root ``q`` misses a token ``p`` has
    (residuals must supply it) and ``p`` misses a token ``q`` drafts (it must never be emitted)."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.vocab, self.length = VOCAB, LENGTH
        self.rows = {prefix: (rng.dirichlet(np.ones(VOCAB)), rng.dirichlet(np.ones(VOCAB)))
                     for n in range(LENGTH + 1) for prefix in itertools.product(range(VOCAB), repeat=n)}
        p, q = self.rows[()]
        p[1], q[0] = 0.0, 0.0
        self.rows[()] = (p / p.sum(), q / q.sum())

    def p(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self.rows[prefix][0]

    def q(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self.rows[prefix][1]


def draw(law: np.ndarray, gen: torch.Generator, count: int = 1, replacement: bool = True) -> list[int]:
    """``count`` tokens from ``law`` with the seeded generator."""
    return torch.multinomial(torch.as_tensor(law), count, replacement, generator=gen).tolist()


def draft_paths(inst: Table, drafts: int, rule: str, gen: torch.Generator) -> tuple[tuple[int, ...], ...]:
    """One draft as ``real_engine.exact`` defines the drafting processes: i.i.d. paths from ``q``; or the
    root's children without replacement or its top-k, each continued by one path from ``q``."""
    root = inst.q(())
    if rule == "iid":
        firsts = draw(root, gen, drafts)
    elif rule == "without_replacement":
        firsts = draw(root, gen, min(drafts, int(np.count_nonzero(root))), replacement=False)
    else:
        firsts = np.argsort(-root, kind="stable")[:drafts].tolist()
    paths = []
    for first in firsts:
        path = [first]
        while len(path) < inst.length:
            path += draw(inst.q(tuple(path)), gen)
        paths.append(tuple(path))
    return tuple(paths)


def product_law(first: Table, rows: str, last: str = "p") -> np.ndarray:
    """Law over ``STRINGS`` of drawing each token from ``rows`` (``p`` or ``q``), the last from ``last``."""
    law = np.ones(len(STRINGS))
    for s, string in enumerate(STRINGS):
        for i, token in enumerate(string):
            law[s] *= getattr(first, last if i == LENGTH else rows)(string[:i])[token]
    return law


def pvalue(counts: np.ndarray, law: np.ndarray) -> float:
    """Chi-square p-value of ``counts`` under ``law`` (0 if a zero-probability string occurred)."""
    if counts[law == 0].sum() > 0:
        return 0.0
    keep = law > 0
    return float(chisquare(counts[keep], law[keep] / law[keep].sum() * counts.sum()).pvalue)


CASES = [("token", "iid", 1), ("block", "iid", 1), ("block", "topk", 1), ("rrs", "iid", 3),
         ("rrs", "without_replacement", 2), ("rrs", "topk", 2), ("gbv", "iid", 3), ("seqbv", "iid", 3),
         ("seqbv", "without_replacement", 2)]


@pytest.mark.parametrize(("verifier", "rule", "drafts"), CASES)
def test_emitted_text_follows_the_target_law(verifier: str, rule: str, drafts: int) -> None:
    inst = Table(seed=len(verifier) + 7 * len(rule) + drafts)
    rows = exact._Rows(inst)
    gen = torch.Generator().manual_seed(1234)
    sampler = TorchSampler(gen)
    index = {string: s for s, string in enumerate(STRINGS)}
    counts = np.zeros(len(STRINGS))
    accepted = 0
    for _ in range(CALLS):
        tree, p = exact.draft_tree(inst, draft_paths(inst, drafts, rule, gen), rule, rows)
        result = VERIFIERS[verifier](tree, p, sampler)
        text = [*(int(tree.tokens[n]) for n in result.path), result.token]
        accepted += len(result.path)
        while len(text) < LENGTH + 1:  # continue from the target
            text += draw(inst.p(tuple(text)), gen)
        counts[index[tuple(text)]] += 1
    assert pvalue(counts, product_law(inst, "p")) > 1e-4
    assert pvalue(counts, product_law(inst, "q")) < 1e-4
    assert accepted > 0


def test_greedy_emits_the_target_argmax_whatever_is_drafted() -> None:
    inst = Table(seed=3)
    rows = exact._Rows(inst)
    gen = torch.Generator().manual_seed(0)
    best: list[int] = []
    while len(best) < LENGTH + 1:
        best.append(int(np.argmax(inst.p(tuple(best)))))
    seen = set()
    for _ in range(200):
        tree, p = exact.draft_tree(inst, draft_paths(inst, 3, "iid", gen), "iid", rows)
        result = VERIFIERS["greedy"](tree, p, None)
        text = [*(int(tree.tokens[n]) for n in result.path), result.token]
        assert text == best[:len(text)]
        seen.add(len(result.path))
    assert seen >= {0, LENGTH}  # both a rejection at the root and a whole path occurred
