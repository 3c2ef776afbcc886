"""What was done about each surviving mutant of ``benchmarks/mutation.py``: the recurring kinds of
equivalent or harmless mutants, and notes by mutant name or glob."""

from __future__ import annotations

STRICT = ("equivalent: the zipped sequences have equal lengths wherever this runs (``strict=True`` only "
          "guards against a bug elsewhere)")
DEVICE = ("equivalent on CPU, where every tensor is on the default device (the GPU check, "
          "``experiments/gpu_check.py``, runs this code on CUDA)")
MESSAGE = ("error text only: the same error is raised where it was; the tests match the field or value it "
           "names, not every word")
DTYPE = "equivalent: the values already have that type (Python ints become int64, float inputs stay float64)"
LAST_TAU = "equivalent: the last window's tau is read only after a drop, and every drop sets it first"
NOTES: dict[str, str] = {
    # real_engine/kv_cache.py
    "real_engine.kv_cache.xǁKVCacheǁkeep__mutmut_1[03]": DTYPE,
    "real_engine.kv_cache.xǁKVCacheǁkeep__mutmut_2": (
        "equivalent: a list prefix then takes the compacting path and a tensor prefix the commit path; both "
        "leave the same cache (test_feedback_paths keeps a tensor prefix and checks the rows)"),
    # real_engine/tree.py
    "real_engine.tree.x_expand_topk__mutmut_21": "equivalent: float('-INF') is float('-inf')",
    "real_engine.tree.xǁDraftTreeǁ__post_init____mutmut_7[47]": DTYPE,
    "real_engine.tree.xǁDraftTreeǁchain__mutmut_[57]": DTYPE,
    "real_engine.tree.xǁDraftTreeǁchain__mutmut_1[25]": DTYPE,
    # real_engine/verify.py
    "real_engine.verify.x__selected_law__mutmut_23": "equivalent: float('INF') is float('inf')",
    "real_engine.verify.x__greatest_path__mutmut_17": (
        "equivalent: the keys are compared at the first position where the tokens differ, so the two tuples "
        "are never equal"),
    "real_engine.verify.x__greatest_path__mutmut_5": (
        "equivalent: comparing the best path with itself finds no differing token and changes nothing"),
    "real_engine.verify.x__selected_law__mutmut_14": (
        "equivalent: where q = 0 the key becomes inf or NaN, both sorted last, and those tokens carry no "
        "q-mass into the cumulative sums"),
    "real_engine.verify.x__selected_law__mutmut_27": "equivalent: argsort's default dimension is the last, 1",
    "real_engine.verify.x_gbv_law__mutmut_52": (
        "equivalent: a drafted token was drawn from q, so its q is positive"),
    "real_engine.verify.x_gbv_law__mutmut_44": (
        "equivalent: q's rows are cast to p's dtype by the division that follows"),
    "real_engine.verify.x_rrs_law__mutmut_26": (
        "equivalent: q's rows are cast to p's dtype by the arithmetic with the residual"),
    "real_engine.verify.x_greedy__mutmut_14": "equivalent: for [nodes, vocab] logits dimension 1 is the last",
    "real_engine.verify.x_greedy__mutmut_4": "equivalent: None is as false as False",
    "real_engine.verify.x__normalize__mutmut_8": (
        "equivalent: the fallback is needed only on branches of probability zero, which neither sampler "
        "takes (the NaN law it leaves there is never drawn from)"),
    "real_engine.verify.x__children__mutmut_6": (
        "killed by timing out: children are listed under the wrong parents and the verifier never ends"),
    "real_engine.verify.x__chains__mutmut_4": (
        "equivalent: node 1's parent is always the root, which the merge check leaves out anyway"),
    "real_engine.verify.x__min_ratio__mutmut_7": (
        "equivalent: where p = 0 the ratio is already 0; only p = q = 0 differs (NaN, which the Bernoulli "
        "reads as a rejection), and a drafted token has q > 0"),
    "real_engine.verify.x__path__mutmut_34": (
        "equivalent: q's rows are cast to p's dtype by the arithmetic with p"),
    "real_engine.verify.x__rows__mutmut_[28]": (
        "equivalent: the condition then never holds, so the rows are copied instead of viewed: same values"),
    "real_engine.verify.x_gbv_law__mutmut_83": (
        "equivalent: with nothing drafted BV returns the root row whatever the draft law"),
    "real_engine.verify.xǁTorchSamplerǁbernoulli__mutmut_9": (
        "equivalent but for a measure-zero event (U exactly equal to prob)"),
    "real_engine.verify.xǁTorchSamplerǁcategorical__mutmut_2[78]": (
        "equivalent but for a measure-zero event (U times the total exactly on a cumulative weight)"),
    "real_engine.verify.x_greedy_law__mutmut_10": (
        "equivalent: every reader normalizes the law (a point mass of weight 2 is the same law)"),
    "real_engine.verify.x_gbv_law__mutmut_61": "equivalent: float('INF') is float('inf')",
    # core/interpolation.py
    "core.interpolation.x_blend__mutmut_13": "equivalent: at w = 1 both branches give hi",
    "core.interpolation.x_bracket__mutmut_20": (
        "equivalent: on an interior grid point side='left' brackets the left segment at weight 1, which "
        "blend turns into the same grid value"),
    "core.interpolation.x_bracket__mutmut_9": (
        "equivalent: x is first raised to grid[0], so the index is never below 0"),
    "core.interpolation.xǁGridǁ__call____mutmut_3[02]": (
        "equivalent: coordinates become float in the arithmetic with the float64 axes"),
    "core.interpolation.xǁSeriesǁgrid__mutmut_1[35]": (
        "equivalent: integer axes give the same brackets and weights (true division) and the same JSON"),
    # core/cost_profile.py
    "core.cost_profile.x__check_fits__mutmut_1[8]": (
        "equivalent: numbers give float64 anyway; text gives a string array, which allclose refuses with "
        "the TypeError that marks the fits stale"),
    "core.cost_profile.x__check_fits__mutmut_20": (
        "equivalent: numbers give float64 anyway; text gives a string array, which allclose refuses with "
        "the TypeError that marks the fits stale"),
    "core.cost_profile.x__check_fits__mutmut_35": "equivalent: None is as false as False",
    "core.cost_profile.x__need__mutmut_[78]": MESSAGE,
    "core.cost_profile.xǁCostProfileǁchain_draft_seconds__mutmut_18": (
        "equivalent: a profile with SpecBlock must have its block size (checked at load), and no other kind "
        "reaches this branch"),
    "core.cost_profile.xǁCostProfileǁstep_seconds__mutmut_25": (
        "equivalent: a table one column wider is built and only the asked columns are read"),
    "core.cost_profile.xǁCostProfileǁstep_seconds__mutmut_28": DTYPE,
    "core.cost_profile.xǁCostProfileǁstep_seconds__mutmut_30": DTYPE,
    "core.cost_profile.xǁCostProfileǁstep_table__mutmut_59": (
        "equivalent on this numpy: reshape reads any negative size as 'the rest'"),
    "core.cost_profile.xǁCostProfileǁupdate_cost__mutmut_27": (
        "equivalent: at one window both branches give one"),
    "core.cost_profile.xǁCostProfileǁupdate_cost__mutmut_4[35]": DTYPE,
    "core.cost_profile.xǁCostProfileǁupdate_cost__mutmut_[57]": DTYPE,
    "core.cost_profile.xǁStepTableǁ__call____mutmut_[35]": DTYPE,
    # simulator/envs.py
    "simulator.envs.xǁSpecLengthBatchǁ__init____mutmut_[123]": (
        "equivalent: both SpecLength environments pass every argument; the batch's own defaults are unused"),
    "simulator.envs.xǁAdaptStreamBatchǁ__init____mutmut_[123]": (
        "equivalent: both AdaptStream environments pass every argument; the batch's own defaults are unused"),
    "simulator.envs.xǁSpecLengthBatchǁ__init____mutmut_10": (
        "equivalent: the batch's drafter name is never read"),
    "simulator.envs.xǁSpecLengthBatchǁ__init____mutmut_19": (
        "not killed: `sequential` is read only by simulator.rollout.run_length, whose chain-versus-tree "
        "drafting of a non-token-by-token chain no selected test checks; left open"),
    "simulator.envs.xǁSpecLengthBatchǁ__init____mutmut_37": (
        "equivalent: a longer array than needed; the extra entry is never indexed"),
    "simulator.envs.xǁSpecLengthBatchǁ__init____mutmut_40": (
        "equivalent: a longer array than needed; the extra entry is never indexed"),
    "simulator.envs.xǁSpecLengthBatchǁ__init____mutmut_56": (
        "equivalent: a longer array than needed; the extra entry is never indexed"),
    "simulator.envs.xǁSpecLengthBatchǁstart__mutmut_13": (
        "equivalent but for a measure-zero event (a uniform draw exactly on a cumulative weight)"),
    "simulator.envs.xǁSpecLengthBatchǁstart__mutmut_17": (
        "equivalent: the index is below the size already (a uniform draw is below the last weight, 1)"),
    "simulator.envs.xǁ*Envǁ__init____mutmut_26": "equivalent: no render mode exists, so none is ever kept",
    "simulator.envs.xǁ*Envǁ__init____mutmut_39": "equivalent: None is as false as False",
    "simulator.envs.xǁ*Envǁstep__mutmut_[234]": MESSAGE,
    "simulator.envs.xǁAdaptStreamEnvǁstep__mutmut_5": MESSAGE,
    "simulator.envs.xǁSpecLengthEnvǁstep__mutmut_9": DTYPE,
    "simulator.envs.xǁSpecLengthEnvǁstep__mutmut_11": DTYPE,
    "simulator.envs.xǁAdaptStreamEnvǁstep__mutmut_1[46]": DTYPE,
    "simulator.envs.xǁSpecLengthBatchǁ__init____mutmut_9": MESSAGE,
    "simulator.envs.x__push__mutmut_22": "equivalent: where the buffer holds nothing the numerator is 0 too",
    "simulator.envs.xǁAdaptStreamBatchǁ__init____mutmut_3[69]": (
        "equivalent under the tested models: their drafts are never cut short of the draft length, so only "
        "the full-length step has weight, where a chain and a tree leave nothing unverified (not killed)"),
    "simulator.envs.xǁAdaptStreamBatchǁ__init____mutmut_4[2456]": (
        "equivalent under the tested models: their drafts are never cut short of the draft length, so only "
        "the full-length step has weight, where a chain and a tree leave nothing unverified (not killed)"),
    "simulator.envs.xǁAdaptStreamBatchǁ__init____mutmut_4[17]": (
        "equivalent under the tested models: only iterations that verify nothing pay the unverified tree, "
        "and the parametric model's drafts are never empty (not killed)"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_223": (
        "equivalent under the tested models: only iterations that verify nothing pay the unverified tree, "
        "and the parametric model's drafts are never empty (not killed)"),
    "simulator.envs.xǁAdaptStreamBatchǁ__init____mutmut_49": (
        "equivalent under the default dynamics: the drafting time moves only when head_draft or full_draft "
        "differs from 1 (not killed)"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_79": (
        "equivalent under the default dynamics: the drafting time moves only when head_draft or full_draft "
        "differs from 1 (not killed)"),
    "simulator.envs.xǁAdaptStreamBatchǁ__init____mutmut_52": (
        "equivalent: skip's capacity entry is never read"),
    "simulator.envs.xǁAdaptStreamBatchǁfills__mutmut_11": (
        "equivalent: a buffer never holds more than its capacity"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_33": (
        "equivalent: a buffer never holds more than its capacity"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_108": (
        "equivalent under the tested profile: windows enter an update's cost only for a profile that counts "
        "update windows, which the paper profile does not (not killed)"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_89": (
        "equivalent under the tested profile: windows enter an update's cost only for a profile that counts "
        "update windows, which the paper profile does not (not killed)"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_90": (
        "equivalent under the tested profile: windows enter an update's cost only for a profile that counts "
        "update windows, which the paper profile does not (not killed)"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_159": (
        "equivalent: the query index never reaches the stream's length while it runs"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_168": (
        "equivalent but for a measure-zero event (a uniform draw exactly on a cumulative weight)"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_170": (
        "equivalent: the count is below the number of domains already (the last cumulative weight is 1)"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_237": "equivalent: the rates are probabilities already",
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_238": "equivalent: the rates are probabilities already",
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_247": "equivalent: the rates are probabilities already",
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_242": (
        "equivalent for the parametric model, whose per-query rates draw nothing at random (a trace replay "
        "would draw its recorded query from a fresh generator: not killed)"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_246": (
        "not killed: the tested domain's rejection rate is already 1 (every iteration of its full-depth "
        "drafts is cut short); a domain with a lower rate would show it"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_26": (
        "not killed: an update on a buffer holding exactly one position is not tested"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_34[347]": (
        "equivalent: only whether a stream has served no query yet is read"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_3[56]": (
        "not killed: the buffer's domain shares move the level only through AdaptationDynamics.updated; the "
        "state test checks that an update moves the level, not by how much"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_43": (
        "not killed: the buffer's domain shares move the level only through AdaptationDynamics.updated; the "
        "state test checks that an update moves the level, not by how much"),
    "simulator.envs.xǁAdaptStreamBatchǁserve__mutmut_4[24]": (
        "equivalent: with an empty buffer no update runs, so the share is never used"),
    "simulator.envs.xǁAdaptStreamEnvǁ[cr]e[sv]e[rt]*__mutmut_[12]": (
        "equivalent for a single stream: indexing with None selects all of it"),
    "simulator.envs.xǁAdaptStreamEnvǁcheckpoint__mutmut_1": (
        "equivalent for a single stream: indexing with None selects all of it"),
    # policies/length.py
    "policies.length.x_expected_tokens__mutmut_[35]": DTYPE,
    "policies.length.x_speedup_curve__mutmut_[358]": DTYPE,
    "policies.length.x_speedup_curve__mutmut_10": DTYPE,
    "policies.length.xǁFixedLengthǁchoose_batch__mutmut_[36]": DTYPE,
    "policies.length.xǁ_LengthPolicyǁ__init____mutmut_6": (
        "equivalent: the length policies' reset ignores the seed"),
    "policies.length.x_speedup_curve__mutmut_17": (
        "killed by test_policies.py (T(0) alone, nothing drafted), added after the second pass"),
    # real_engine/decode.py
    "real_engine.decode.x_make_drafter__mutmut_*": (
        "killed by the tests added to test_decode_edges.py (each first-pass survivor applied with `mutmut "
        "apply` and those tests run: 37 of 37 fail); the second pass ran the loop's step functions only"),
    "real_engine.decode.xǁStatsǁto_dict__mutmut_*": (
        "killed by test_decode_edges.py::test_stats_to_dict_is_plain_json (added; checked with `mutmut "
        "apply`)"),
    "real_engine.decode.x_prefill__mutmut_*": (
        "killed by test_decode_edges.py::test_a_one_token_prompt_prefills_nothing_and_decodes (added "
        "after the "
        "second pass; checked by applying the mutant)"),
    "real_engine.decode.x__speculative_step__mutmut_[12]": (
        "killed by test_decode_edges.py::test_the_largest_tree_the_cache_holds_is_verified_and_a_larger_one_"
        "refused (added after the second pass; checked by applying the mutant)"),
    "real_engine.decode.x__speculative_step__mutmut_14": (
        "killed by test_feedback_paths.py (a tree whose last node is two deep is not a chain; added after "
        "the second pass; checked by applying the mutant)"),
    "real_engine.decode.x__speculative_step__mutmut_31": (
        "killed by test_decode_edges.py::test_overhead_is_what_the_forwards_leave_of_the_seconds (added "
        "after the "
        "second pass; checked by applying the mutant)"),
    "real_engine.decode.x__vanilla_step__mutmut_14": (
        "killed by test_decode_edges.py::test_overhead_is_what_the_forwards_leave_of_the_seconds (added "
        "after the "
        "second pass; checked by applying the mutant)"),
    "real_engine.decode.x__check__mutmut_23": (
        "killed by test_decode_edges.py::test_the_prompt_and_new_tokens_may_fill_the_context_exactly "
        "(added after "
        "the second pass; checked by applying the mutant)"),
    "real_engine.decode.x__speculative_step__mutmut_8": (
        "equivalent: a chain's tree mask is the causal mask the model builds; only the shortcut is lost"),
    "real_engine.decode.x__speculative_step__mutmut_1[013]": (
        "equivalent: the test then fails for chains (or holds only for a two-node chain), and a chain's tree "
        "mask is the causal mask the model builds; only the shortcut is lost"),
    "real_engine.decode.x__speculative_step__mutmut_27": (
        "equivalent: a chain's tree mask is the causal mask the model builds; only the shortcut is lost"),
    "real_engine.decode.x__speculative_step__mutmut_2[459]": DEVICE,
    "real_engine.decode.x__speculative_step__mutmut_4[478]": (
        "equivalent: at temperature 0 (the only one the greedy verifier takes) warp gives the argmax's "
        "point mass, whose argmax is the logits' (ties to the lower id in both)"),
    "real_engine.decode.x__vanilla_step__mutmut_21": (
        "equivalent: at temperature 0 warp gives the argmax's point mass, which the draw returns (the draw "
        "moves the generator, which nothing else reads at temperature 0)"),
    # policies/adaptation.py
    "policies.adaptation.xǁCostAwareBanditǁacknowledge_revert__mutmut_6": LAST_TAU,
    "policies.adaptation.xǁCostAwareBanditǁreset__mutmut_24": LAST_TAU,
    "policies.adaptation.xǁCostAwareBanditǁact__mutmut_11": (
        "equivalent but for a measure-zero event (a uniform draw exactly equal to epsilon)"),
    "policies.adaptation.xǁEpsilonGreedyAdaptǁact__mutmut_2": (
        "equivalent but for a measure-zero event (a uniform draw exactly equal to epsilon)"),
    "policies.adaptation.xǁCostAwareBanditǁobserve__mutmut_50": (
        "equivalent: a cooldown below 0 reads as none (act tests > 0) and every event resets it"),
    "policies.adaptation.xǁCostAwareBanditǁreset__mutmut_1[678]": (
        "equivalent: the warm-up window's action, trigger and reference throughput are never read"),
    "policies.adaptation.xǁCostAwareBanditǁreset__mutmut_22": (
        "equivalent: the warm-up window's action, trigger and reference throughput are never read"),
}
"""What was done about a survivor, by mutant name or glob (the first matching pattern wins); survivors
that a test added here kills are gone from the second pass, and ``category`` covers the recurring kinds."""
