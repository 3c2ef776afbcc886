"""What the decode loop keeps of a tree: the target's rows of the root and the accepted path, even where that
path is not the tree's first nodes, handed to the drafter's ``accept`` and kept in the KV cache (greedy
equality cannot see a wrong hand-off: the output stays lossless, only acceptance falls). Tiny random-weight
models, CPU."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from core.errors import InputError
from real_engine.decode import generate, prefill
from real_engine.drafters.base import Drafter
from real_engine.drafters.eagle import EagleDrafter, TreeShape, new_eagle
from real_engine.drafters.specblock import SpecBlock, SpecBlockDrafter
from real_engine.kv_cache import KVCache
from real_engine.model import ModelArgs, Output, Transformer
from real_engine.tree import DraftTree
from real_engine.warp import Sampling

VOCAB = 16
PROMPT = [3, 9, 4, 11, 8, 1]
GREEDY = Sampling()


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target() -> Transformer:
    args = ModelArgs(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    torch.manual_seed(0)
    return Transformer(args).eval()


def is_prefix(path: Sequence[int]) -> bool:
    """Whether ``path`` is nodes 1..n: the one case where the target's first rows are the right ones."""
    return tuple(path) == tuple(range(1, len(path) + 1))


class DecoyDrafter:
    """Proposes root -> {decoy, g1}, decoy -> {decoy}, g1 -> {g2} (``late``: root -> {decoy, g1}, g1 -> {g2},
    a tree whose last node is two deep), where g is the target's greedy continuation: greedy verification
    accepts nodes (2, 4) (``late``: (2, 3)), never a prefix of the tree."""

    def __init__(self, continuation: list[int], late: bool = False) -> None:
        self.continuation, self.late = continuation, late
        self.model_seconds = 0.0
        self.feedback: list[tuple[int, tuple[int, ...], int, Output]] = []  # (emitted, path, token, rows)

    def begin(self, prompt: torch.Tensor, target: Output, sampling: Sampling, generator: torch.Generator,
              max_length: int) -> None:
        """Start at the prompt's end: nothing emitted yet."""
        self.root, self.emitted = int(prompt[-1]), 0

    def propose(self, max_depth: int) -> DraftTree:
        """The decoy tree, cut to ``max_depth``."""
        g = self.continuation[self.emitted:self.emitted + 2]
        nodes = [(self.root, -1), ((g[0] + 1) % VOCAB, 0), (g[0], 0), ((g[0] + 2) % VOCAB, 1), (g[1], 2)]
        if self.late:
            nodes = nodes[:3] + nodes[4:]
        nodes = nodes[:{0: 1, 1: 3}.get(max_depth, 5)]
        return DraftTree(torch.tensor([t for t, _ in nodes]), torch.tensor([p for _, p in nodes]))

    def accept(self, path: Sequence[int], token: int, target: Output) -> None:
        """Record what the loop handed over."""
        self.feedback.append((self.emitted, tuple(path), token, target))
        self.emitted += len(path) + 1
        self.root = token


@pytest.mark.parametrize("late", [False, True])
@torch.inference_mode()
def test_accept_gets_the_target_rows_of_the_accepted_path_not_the_first_nodes(late: bool,
                                                                              target: Transformer) -> None:
    new = 13
    continuation = list(generate(target, PROMPT, max_new_tokens=new + 2).tokens)
    drafter = DecoyDrafter(continuation, late)
    out = generate(target, PROMPT, drafter=drafter, max_new_tokens=new)
    assert list(out.tokens) == continuation[:new]
    path = (2, 3) if late else (2, 4)
    assert len(drafter.feedback) == 4 and all(p == path for _, p, _, _ in drafter.feedback)
    fresh = target(torch.tensor([PROMPT + continuation]))  # one forward over the committed text, no cache
    for emitted, path, token, rows in drafter.feedback:
        assert token == continuation[emitted + len(path)]
        first = len(PROMPT) - 1 + emitted  # the root's position
        for got, want in zip(rows, fresh, strict=True):
            assert got.shape[1] == len(path) + 1
            torch.testing.assert_close(got, want[:, first:first + len(path) + 1], atol=1e-5, rtol=1e-5)


class FreshCheck:
    """Wraps a drafter; at each proposal a new drafter begun on the committed text proposes too."""

    def __init__(self, make: Callable[[], Drafter], target: Transformer, prompt: list[int]) -> None:
        self.make, self.target, self.inner = make, target, make()
        self.committed = list(prompt)
        self.pairs: list[tuple[DraftTree, DraftTree]] = []
        self.paths: list[tuple[int, ...]] = []

    @property
    def model_seconds(self) -> float:
        """The wrapped drafter's model time."""
        return self.inner.model_seconds

    def begin(self, prompt: torch.Tensor, target: Output, sampling: Sampling, generator: torch.Generator,
              max_length: int) -> None:
        """Begin the wrapped drafter."""
        self.max_length = max_length
        self.inner.begin(prompt, target, sampling, generator, max_length)

    def propose(self, max_depth: int) -> DraftTree:
        """The wrapped drafter's tree; a freshly begun drafter's tree is kept beside it."""
        tree = self.inner.propose(max_depth)
        fresh = self.make()
        cache = self.target.new_cache(self.max_length + 64)
        rows = prefill(self.target, cache, torch.tensor(self.committed[:-1]))
        generator = torch.Generator().manual_seed(0)
        fresh.begin(torch.tensor(self.committed), rows, GREEDY, generator, self.max_length)
        self.pairs.append((tree, fresh.propose(max_depth)))
        return tree

    def accept(self, path: Sequence[int], token: int, target: Output) -> None:
        """Extend the committed text, then pass the feedback on."""
        tree = self.pairs[-1][0]
        self.committed += [int(tree.tokens[n]) for n in path] + [token]
        self.paths.append(tuple(path))
        self.inner.accept(path, token, target)


def eagle(target: Transformer) -> Callable[[], Drafter]:
    net = new_eagle(target, seed=1)
    return lambda: EagleDrafter(net, target, TreeShape(depth=3, top_k=4, total_tokens=12))


def specblock(target: Transformer) -> Callable[[], Drafter]:
    net = SpecBlock.for_target(target, seed=2).eval()
    with torch.no_grad():  # the rank head always predicts bucket 2: ten children per drafted slot
        net.rank_head.down.bias.copy_(torch.tensor([0.0, 0.0, 20.0, -20.0]))
    return lambda: SpecBlockDrafter(net, blocks=2, starts=2, budget=16)


@pytest.mark.parametrize("factory", [eagle, specblock])
@torch.inference_mode()
def test_after_tree_paths_a_drafter_proposes_as_if_begun_on_the_committed_text(
        factory: Callable[[Transformer], Callable[[], Drafter]], target: Transformer) -> None:
    """Feature drafters condition on the rows ``accept`` receives: wrong rows change their next tree."""
    checked = FreshCheck(factory(target), target, PROMPT)
    vanilla = generate(target, PROMPT, max_new_tokens=40).tokens
    assert generate(target, PROMPT, drafter=checked, max_new_tokens=40).tokens == vanilla
    assert any(path and not is_prefix(path) for path in checked.paths)  # the case under test occurred
    for tree, fresh in checked.pairs:
        assert tree.tokens.tolist() == fresh.tokens.tolist()
        assert tree.parents.tolist() == fresh.parents.tolist()
        torch.testing.assert_close(tree.q, fresh.q, atol=1e-4, rtol=1e-4)


def written(cache: KVCache, count: int, start: float) -> torch.Tensor:
    """Write ``count`` positions of distinct values (from ``start``) to every layer; the values [T, D]."""
    values = start + torch.arange(count * 2, dtype=cache.k.dtype).view(count, 2)
    for layer in range(cache.k.shape[0]):
        block = (values + 100 * layer)[None, None]
        cache.write(layer, block, -block)
    return values


def test_the_cache_keeps_the_accepted_nodes_in_order_after_the_committed_prefix() -> None:
    cache = KVCache(2, 1, 1, 2, 8, dtype=torch.float64)
    prefix = written(cache, 2, 0.0)
    cache.commit()
    tree = written(cache, 4, 50.0)
    cache.keep([0, 2, 3])
    assert (cache.length, cache.pending) == (5, 0)
    for layer in range(2):
        kept = torch.cat((prefix, tree[[0, 2, 3]])) + 100 * layer
        torch.testing.assert_close(cache.k[layer, 0, 0, :5], kept)
        torch.testing.assert_close(cache.v[layer, 0, 0, :5], -cache.k[layer, 0, 0, :5])
    chain = written(cache, 3, 90.0)
    cache.keep(torch.tensor([0, 1]))  # a tensor prefix goes the compacting way and lands the same
    torch.testing.assert_close(cache.k[0, 0, 0, 5:7], chain[:2])
    written(cache, 1, 0.0)
    cache.keep([])
    assert (cache.length, cache.pending) == (7, 0)


def test_the_cache_checks_its_bounds_and_forgets_what_is_pending() -> None:
    cache = KVCache(1, 1, 1, 2, 6)
    assert (cache.k.dtype, cache.v.dtype, cache.k.device.type) == (torch.float32, torch.float32, "cpu")
    cache.commit()
    assert (cache.length, cache.pending) == (0, 0)  # nothing was pending
    written(cache, 4, 0.0)
    with pytest.raises(ValueError, match=r"^cannot commit 5 of 4 pending positions$"):
        cache.commit(5)
    for bad in ([4], [-1, 0]):
        with pytest.raises(ValueError, match=r"^keep indices must lie in \[0, 4\)$"):
            cache.keep(torch.tensor(bad))
    cache.keep(torch.tensor([3]))
    written(cache, 2, 0.0)
    cache.commit(0)
    assert (cache.length, cache.pending) == (1, 0)
    written(cache, 5, 0.0)  # exactly fills the cache
    cache.commit()
    with pytest.raises(InputError, match=r"^the KV cache holds 6 positions but 7 are needed: raise "
                                         r"max_length or shorten the prompt or the number of new tokens$"):
        written(cache, 1, 0.0)
    cache.truncate(6)
    cache.truncate(2)
    cache.commit()
    assert (cache.length, cache.pending) == (2, 0)
    with pytest.raises(ValueError, match=r"^cannot truncate a cache of length 2 to 3$"):
        cache.truncate(3)
    cache.truncate(0)
    assert cache.length == 0
