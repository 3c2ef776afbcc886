"""The model against ``transformers`` (test-only reference), tree forwards, and KV cache compaction."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InputError
from real_engine.decode import prefill
from real_engine.model import Transformer, load_model, save_model
from real_engine.tree import DraftTree

VOCAB = 96


def reference(folder: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def random_tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def target(llama_dir: Path) -> Transformer:
    return load_model(llama_dir)


@pytest.mark.parametrize("checkpoint", ["llama_dir", "qwen3_dir"])
@torch.inference_mode()
def test_logits_match_transformers(checkpoint: str, request: pytest.FixtureRequest) -> None:
    folder = request.getfixturevalue(checkpoint)
    ours, ref = load_model(folder), reference(folder)
    tokens = random_tokens(48, seed=1)  # past the llama3 scaling's original 32 positions
    expected = ref(tokens[None]).logits[0]
    torch.testing.assert_close(ours(tokens[None]).logits[0], expected, atol=1e-4, rtol=0)
    cache = ours.new_cache(64)
    # a prefill computes the prompt's last logits only (the decode loop reads no others)
    last = prefill(ours, cache, tokens[:40]).logits[0]
    torch.testing.assert_close(last, expected[39:40], atol=1e-4, rtol=0)
    for i in range(40, 48):
        step = ours(tokens[None, i:i + 1], cache=cache).logits[0, 0]
        cache.commit()
        torch.testing.assert_close(step, expected[i], atol=1e-4, rtol=0)


@pytest.mark.parametrize("checkpoint", ["llama_dir", "qwen3_dir"])  # untied, tied embeddings
@torch.inference_mode()
def test_saved_model_loads_in_transformers(checkpoint: str, request: pytest.FixtureRequest,
                                           tmp_path: Path) -> None:
    ours = load_model(request.getfixturevalue(checkpoint))
    save_model(ours, tmp_path, dtype=torch.float32)
    ref = reference(tmp_path)
    assert (ref.lm_head.weight.data_ptr() == ref.model.embed_tokens.weight.data_ptr()) == \
        ours.args.tie_word_embeddings
    tokens = random_tokens(20, seed=2)
    torch.testing.assert_close(ours(tokens[None]).logits, ref(tokens[None]).logits, atol=1e-4, rtol=0)


@torch.inference_mode()
def test_sharded_save_loads_here_and_in_transformers(llama_dir: Path, tmp_path: Path) -> None:
    """Past ``max_shard_bytes`` the weights go to shards with transformers' index; saving again unsharded
    removes them, so no stale file shadows the new weights."""
    ours = load_model(llama_dir)
    biggest = max(t.numel() * 4 for t in ours.state_dict().values())
    save_model(ours, tmp_path, dtype=torch.float32, max_shard_bytes=biggest)
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(shards) > 2 and "model.safetensors" not in shards
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    assert max((tmp_path / s).stat().st_size for s in shards) < 2 * biggest
    tokens = random_tokens(20, seed=2)
    expected = ours(tokens[None]).logits
    torch.testing.assert_close(load_model(tmp_path)(tokens[None]).logits, expected, atol=0, rtol=0)
    torch.testing.assert_close(reference(tmp_path)(tokens[None]).logits, expected, atol=1e-4, rtol=0)
    save_model(ours, tmp_path, dtype=torch.float32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]


def test_bad_shard_index_is_an_input_error(llama_dir: Path, tmp_path: Path) -> None:
    save_model(load_model(llama_dir), tmp_path, dtype=torch.float32, max_shard_bytes=1)
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": ["model.safetensors"]}')
    with pytest.raises(InputError, match="not a valid safetensors index"):
        load_model(tmp_path)


def path_to(parents: list[int], node: int) -> list[int]:
    """Node indices from the root (included) to ``node``."""
    path = [node]
    while path[-1] > 0:
        path.append(parents[path[-1]])
    return path[::-1]


@torch.inference_mode()
def test_tree_forward_equals_each_path_run_causally(target: Transformer) -> None:
    prefix = random_tokens(11, seed=3)
    parents = [-1, 0, 0, 1, 1, 2, 3, 3, 5, 0, 8]
    tree = DraftTree(random_tokens(len(parents), seed=4), torch.tensor(parents))
    cache = target.new_cache(64)
    prefill(target, cache, prefix)
    out = target(tree.tokens[None], tree.positions(cache.length), cache, tree.mask())
    for node in range(tree.size):
        sequence = torch.cat((prefix, tree.tokens[path_to(parents, node)]))
        expected = target(sequence[None])
        torch.testing.assert_close(out.logits[0, node], expected.logits[0, -1], atol=1e-5, rtol=0)
        torch.testing.assert_close(out.features[0, node], expected.features[0, -1], atol=1e-5, rtol=0)


@torch.inference_mode()
def test_full_width_mask_hides_committed_positions(target: Transformer) -> None:
    """A [T, length + T] mask (what a drafter expanding a tree depth by depth passes) is used as given."""
    tokens = random_tokens(9, seed=5)
    cache = target.new_cache(32)
    prefill(target, cache, tokens[:6])
    mask = torch.ones(3, 9, dtype=torch.bool).tril(6)
    mask[:, 4:6] = False  # hide committed positions 4 and 5 from every new token
    out = target(tokens[None, 6:], cache=cache, tree_mask=mask).logits[0]
    kept = torch.cat((tokens[:4], tokens[6:]))
    positions = torch.tensor([0, 1, 2, 3, 6, 7, 8])
    expected = target(kept[None], positions).logits[0, -3:]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


@st.composite
def trees(draw: st.DrawFn) -> tuple[int, list[int], int, int]:
    """(prefix length, tree parents, the node whose path is kept, a token seed)."""
    size = draw(st.integers(1, 9))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, size)]
    return draw(st.integers(1, 12)), parents, draw(st.integers(0, size - 1)), draw(st.integers(0, 10**6))


@settings(max_examples=12, deadline=None)
@given(case=trees())
@torch.inference_mode()
def test_keep_path_then_decode_equals_fresh_prefill(target: Transformer,
                                                    case: tuple[int, list[int], int, int]) -> None:
    prefix_length, parents, node, seed = case
    prefix, tree_tokens = random_tokens(prefix_length, seed), random_tokens(len(parents) + 1, seed + 1)
    tree = DraftTree(tree_tokens[:-1], torch.tensor(parents))
    cache = target.new_cache(32)
    prefill(target, cache, prefix)
    target(tree.tokens[None], tree.positions(cache.length), cache, tree.mask())
    path = path_to(parents, node)
    cache.keep(path)
    assert cache.length == prefix_length + len(path)
    following = tree_tokens[-1:]
    step = target(following[None], cache=cache).logits[0, -1]
    fresh = target(torch.cat((prefix, tree.tokens[path], following))[None]).logits[0, -1]
    torch.testing.assert_close(step, fresh, atol=1e-5, rtol=0)


def test_missing_or_corrupt_weights_raise_input_error(llama_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(llama_dir, broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(InputError, match="missing weights file"):
        load_model(broken)
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(InputError, match="corrupt"):
        load_model(broken)
