"""SpecLength's token and time accounting under an acceptance that is known exactly: every draft accepts
exactly k positions, so each step must emit min(n, k) + 1 tokens (the bonus included), the last step is
cut at ``tokens_per_query``, and each reward is minus T(n) worked out by hand from the profile's numbers."""

from __future__ import annotations

import numpy as np
import pytest

from core.cost_profile import profile_from_json
from core.errors import InputError
from policies.features import LENGTH_CAP
from simulator.acceptance import Draws
from simulator.spec_length import SpecLengthEnv, SpecLengthVectorEnv

PROMPT = 300
NODES = [1, 2, 4, 8, 16, 32]
CONTEXTS = [0, 1024, 4096]
DEPTHS = [1, 2, 4, 8, 16]


def vanilla(context: int) -> float:
    """Seconds of a plain decoding step (linear in the context, so exact between grid points)."""
    return 0.009 + 1e-6 * context


def verify(nodes: int, context: int) -> float:
    """Seconds of one target forward over ``nodes`` tree nodes (linear in both)."""
    return 0.01 + 5e-4 * nodes + 2e-6 * context


def draft(depth: int) -> float:
    """Seconds of drafting an EAGLE chain ``depth`` deep (linear)."""
    return 1e-3 * depth


def step_seconds(n: int, context: int) -> float:
    """T(n) from the formulas above: vanilla at n = 0, else drafting n plus verifying n + 1 nodes."""
    return vanilla(context) if n == 0 else draft(n) + verify(n + 1, context)


def profile_json() -> dict:
    """A measured-profile dict sampled from the formulas, one timing per grid point."""
    return {
        "schema_version": 1, "device": "test cpu", "dtype": "float32",
        "models": {"target": "tiny", "drafters": {"eagle": "tiny-eagle"}},
        "block_size": None, "derived_from": None,
        "samples": {
            "verify": [{"nodes": n, "context": c, "seconds": [verify(n, c)]}
                       for n in NODES for c in CONTEXTS],
            "vanilla": [{"context": c, "seconds": [vanilla(c)]} for c in CONTEXTS],
            "draft": {"eagle": [{"depth": d, "seconds": [draft(d)]} for d in DEPTHS]},
            "update": {"head": [0.05], "full": [0.5]},
        },
    }


class ExactlyK:
    """An acceptance model whose every draft is a chain ``drafted`` deep accepting exactly ``k`` positions;
    with ``per_domain``, domain i accepts ``per_domain[i]``."""

    cap = LENGTH_CAP

    def __init__(self, k: int, drafted: int = LENGTH_CAP, per_domain: tuple[int, ...] = ()) -> None:
        self.k, self.drafted, self.per_domain = k, drafted, per_domain
        self.domains = tuple(f"d{i}" for i in range(len(per_domain))) or ("only",)

    def sample(self, rng: np.random.Generator, domain: np.ndarray) -> Draws:
        """The same draft for every slot of a domain (no randomness used)."""
        n = domain.size
        accepted = np.asarray(self.per_domain)[domain] if self.per_domain else np.full(n, self.k)
        conf = np.where(np.arange(self.cap) < self.drafted, 0.5, 0.0).astype(np.float32)
        return Draws(np.tile(conf, (n, 1)), np.full(n, self.drafted), accepted)


def expected_episode(k: int, action: int, tokens: int) -> list[tuple[int, int, float]]:
    """(accepted, emitted, seconds) of each step, worked out by hand."""
    steps, emitted = [], 0
    while emitted < tokens:
        n = min(action, LENGTH_CAP)
        accepted = min(n, k)
        new = min(accepted + 1, tokens - emitted)
        steps.append((accepted, new, step_seconds(n, PROMPT + emitted)))
        emitted += new
    return steps


CASES = [(3, 8, 50), (5, 2, 20), (0, 4, 7), (16, 16, 40), (4, 0, 5), (2, 3, 3)]


@pytest.mark.parametrize(("k", "action", "tokens"), CASES)
def test_each_step_emits_the_accepted_tokens_and_the_bonus_at_the_profiles_cost(k: int, action: int,
                                                                                tokens: int) -> None:
    env = SpecLengthEnv(profile_from_json(profile_json()), ExactlyK(k), drafter="eagle",
                        tokens_per_query=tokens, prompt_tokens=(PROMPT, PROMPT), steered=False)
    obs, _ = env.reset(seed=0)
    assert obs[0] == PROMPT
    want = expected_episode(k, action, tokens)
    got, rewards = [], []
    for _ in range(tokens):  # every step emits at least one token
        obs, reward, terminated, truncated, info = env.step(action)
        assert not truncated
        got.append((info["accepted"], info["tokens"]))
        rewards.append(reward)
        if terminated:
            break
    assert terminated
    assert got == [(a, t) for a, t, _ in want]
    assert sum(t for _, t in got) == tokens
    assert rewards == pytest.approx([-s for _, _, s in want], rel=1e-9, abs=0)
    assert sum(rewards) == pytest.approx(-sum(s for _, _, s in want), rel=1e-9)


def test_the_last_step_is_cut_at_tokens_per_query() -> None:
    env = SpecLengthEnv(profile_from_json(profile_json()), ExactlyK(6), drafter="eagle", tokens_per_query=10,
                        prompt_tokens=(PROMPT, PROMPT), steered=False)
    env.reset(seed=0)
    _, _, terminated, _, first = env.step(8)
    assert (first["accepted"], first["tokens"], terminated) == (6, 7, False)
    _, reward, terminated, _, last = env.step(8)
    assert (last["accepted"], last["tokens"], terminated) == (6, 3, True)  # 7 would overshoot the 10
    assert reward == pytest.approx(-step_seconds(8, PROMPT + 7), rel=1e-9)


@pytest.mark.parametrize(("k", "action", "tokens"), CASES[:3])
def test_the_vector_env_accounts_alike(k: int, action: int, tokens: int) -> None:
    env = SpecLengthVectorEnv(3, profile_from_json(profile_json()), ExactlyK(k), drafter="eagle",
                              tokens_per_query=tokens, prompt_tokens=(PROMPT, PROMPT), steered=False)
    env.reset(seed=0)
    want = expected_episode(k, action, tokens)
    for accepted, emitted, seconds in want:
        _, reward, terminated, _, info = env.step(np.full(3, action))
        assert info["accepted"].tolist() == [accepted] * 3 and info["tokens"].tolist() == [emitted] * 3
        assert reward == pytest.approx(np.full(3, -seconds), rel=1e-9)
    assert terminated.all()


def steering(drafted: int) -> float:
    """The policy's own seconds in an iteration that drafted ``drafted`` positions (linear)."""
    return 1e-4 + 1e-5 * drafted


def run(env: SpecLengthEnv, action: int, steps: int) -> list[tuple[dict, float, np.ndarray]]:
    """(info, reward, observation before the step) of ``steps`` steps."""
    obs, _ = env.reset(seed=0)
    out = []
    for _ in range(steps):
        new, reward, _, _, info = env.step(action)
        out.append((info, reward, obs))
        obs = new
    return out


def test_steering_is_charged_by_positions_drafted_unless_unsteered() -> None:
    data = profile_json()
    data["samples"]["steering"] = [{"drafted": d, "seconds": [steering(d)]} for d in (0, 8, 16)]
    kwargs = {"drafter": "eagle", "tokens_per_query": 40, "prompt_tokens": (PROMPT, PROMPT)}
    steered = SpecLengthEnv(profile_from_json(data), ExactlyK(2), **kwargs)
    for i, (info, reward, _) in enumerate(run(steered, 6, 3)):
        context = PROMPT + 3 * i
        assert reward == pytest.approx(-(step_seconds(6, context) + steering(6)), rel=1e-9)
        assert info["draft_seconds"] == pytest.approx(draft(6) + steering(6), rel=1e-9)
    plain = SpecLengthEnv(profile_from_json(data), ExactlyK(2), steered=False, **kwargs)
    info, reward, _ = run(plain, 6, 1)[0]
    assert reward == pytest.approx(-step_seconds(6, PROMPT), rel=1e-9)
    assert info["draft_seconds"] == pytest.approx(draft(6), rel=1e-9)


def test_a_chain_is_charged_what_it_drafted_and_a_tree_is_drafted_whole() -> None:
    kwargs = {"drafter": "eagle", "tokens_per_query": 40, "prompt_tokens": (PROMPT, PROMPT), "steered": False}
    chain = SpecLengthEnv(profile_from_json(profile_json()), ExactlyK(2, drafted=6), **kwargs)
    info, reward, _ = run(chain, 10, 1)[0]  # 10 asked, 6 drafted: verify and charge 6
    assert (info["drafted"], info["available"], info["accepted"], info["tokens"]) == (6, 6, 2, 3)
    assert reward == pytest.approx(-step_seconds(6, PROMPT), rel=1e-9)
    tree = SpecLengthEnv(profile_from_json(profile_json()), ExactlyK(2), draft_shape={"depth": 4}, **kwargs)
    for n in (1, 5):
        info, reward, _ = run(tree, n, 1)[0]
        assert reward == pytest.approx(-(draft(4) + verify(n + 1, PROMPT)), rel=1e-9)
        assert info["draft_seconds"] == pytest.approx(draft(4), rel=1e-9)
    assert run(tree, 0, 1)[0][1] == pytest.approx(-vanilla(PROMPT), rel=1e-9)


def test_the_policy_sees_the_observed_profile_and_pays_the_measured_one() -> None:
    slow = profile_json()
    for series in ("verify", "vanilla"):
        for row in slow["samples"][series]:
            row["seconds"] = [2 * s for s in row["seconds"]]
    env = SpecLengthEnv(profile_from_json(profile_json()), ExactlyK(3), drafter="eagle", tokens_per_query=40,
                        prompt_tokens=(PROMPT, PROMPT), steered=False, observed=profile_from_json(slow))
    _, reward, obs = run(env, 4, 1)[0]
    shown = [vanilla(PROMPT) * 2, *(draft(n) + 2 * verify(n + 1, PROMPT) for n in range(1, LENGTH_CAP + 1))]
    assert obs[17:] == pytest.approx(shown, rel=1e-9)
    assert reward == pytest.approx(-step_seconds(4, PROMPT), rel=1e-9)


def test_queries_come_from_the_weighted_domains() -> None:
    model = ExactlyK(0, per_domain=(1, 5))
    env = SpecLengthEnv(profile_from_json(profile_json()), model, drafter="eagle", tokens_per_query=12,
                        prompt_tokens=(PROMPT, PROMPT), domain_weights={"d1": 1.0})
    for seed in range(12):  # every query, not just the first, comes from d1
        env.reset(seed=seed)
        info = env.step(8)[4]
        assert (info["domain"], info["accepted"], info["tokens"]) == ("d1", 5, 6)
    vector = SpecLengthVectorEnv(64, profile_from_json(profile_json()), model, drafter="eagle",
                                 tokens_per_query=12, prompt_tokens=(0, 1000))
    obs, _ = vector.reset(seed=1)
    assert len(set(obs[:, 0].tolist())) > 32  # each slot draws its own prompt length
    _, _, _, _, info = vector.step(np.full(64, 8))
    assert set(info["accepted"].tolist()) == {1, 5}  # and its own domain


@pytest.mark.parametrize(("tokens", "prompt", "message"), [
    (0, (0, 0), "tokens_per_query = 0 is invalid"), (True, (0, 0), "tokens_per_query = True is invalid"),
    (1.5, (0, 0), "tokens_per_query = 1.5 is invalid"), (4, (5, 3), r"prompt_tokens = \(5, 3\) is invalid"),
    (4, (-1, 3), r"prompt_tokens = \(-1, 3\) is invalid")])
def test_query_sizes_are_checked(tokens, prompt, message) -> None:
    with pytest.raises(InputError, match=message):
        SpecLengthEnv(profile_from_json(profile_json()), ExactlyK(1), drafter="eagle",
                      tokens_per_query=tokens, prompt_tokens=prompt)


def test_the_smallest_query_is_one_token_after_an_empty_prompt() -> None:
    env = SpecLengthEnv(profile_from_json(profile_json()), ExactlyK(3), drafter="eagle", tokens_per_query=1,
                        prompt_tokens=(0, 0), steered=False)
    obs, _ = env.reset(seed=0)
    assert obs[0] == 0
    _, reward, terminated, _, info = env.step(4)
    assert terminated and info["tokens"] == 1 and reward == pytest.approx(-step_seconds(4, 0), rel=1e-9)


def test_a_tree_drafted_whole_is_steered_by_what_was_asked_and_shown_as_the_observed_tree() -> None:
    """A tree is drafted whole: asking 10 of a 6-node draft verifies 6 and steers 10; the policy is shown the
    observed profile's tree step times."""
    data = profile_json()
    data["samples"]["steering"] = [{"drafted": d, "seconds": [steering(d)]} for d in (0, 8, 16)]
    slow = profile_json()
    for row in slow["samples"]["draft"]["eagle"]:
        row["seconds"] = [3 * s for s in row["seconds"]]
    env = SpecLengthEnv(profile_from_json(data), ExactlyK(2, drafted=6), drafter="eagle", tokens_per_query=40,
                        prompt_tokens=(PROMPT, PROMPT), draft_shape={"depth": 4},
                        observed=profile_from_json(slow))
    info, reward, obs = run(env, 10, 1)[0]
    assert (info["drafted"], info["accepted"]) == (6, 2)
    assert reward == pytest.approx(-(draft(4) + verify(7, PROMPT) + steering(10)), rel=1e-9)
    shown = [vanilla(PROMPT), *(3 * draft(4) + verify(n + 1, PROMPT) for n in range(1, LENGTH_CAP + 1))]
    assert obs[17:] == pytest.approx(shown, rel=1e-9)
