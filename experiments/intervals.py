"""95% intervals by bootstrap: resample prompts (or recorded queries) with replacement within each
domain, so every replicate keeps the domain mix, recompute the statistic, and take the percentile
interval. Policies measured on the same prompts share the resampled indices (a paired bootstrap), so
a ratio between two policies or the fidelity error over all of them carries their correlation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

LEVEL = 0.95
REPLICATES = 2000  # resamples of the measured prompts (cheap: sums of arrays)


def resamples(domains: Sequence[str], replicates: int, seed: int) -> np.ndarray:
    """(replicates, n) indices into ``domains``' items, drawn with replacement within each domain."""
    labels = np.asarray(domains)
    rng = np.random.default_rng(seed)
    out = np.empty((replicates, labels.size), dtype=np.int64)
    for domain in np.unique(labels):
        members = np.flatnonzero(labels == domain)
        out[:, members] = rng.choice(members, size=(replicates, members.size))
    return out


def interval(values: np.ndarray) -> list[float]:
    """The central ``LEVEL`` percentile interval of bootstrap replicates."""
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(np.asarray(values, dtype=np.float64), [tail, 100 - tail])
    return [float(low), float(high)]


def ratio_of_sums(numerator: np.ndarray, denominator: np.ndarray, index: np.ndarray) -> np.ndarray:
    """sum(numerator) / sum(denominator) over each replicate's resampled items: (replicates,)."""
    return numerator[index].sum(axis=1) / denominator[index].sum(axis=1)


def resample_queries(traces: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    """A bootstrap replicate of a trace: its recorded queries drawn with replacement within each domain,
    renumbered so a query drawn twice replays as two queries."""
    queries = traces[["query_id", "domain"]].drop_duplicates()
    picked = []
    for _, group in queries.groupby("domain", sort=True):
        picked.extend(rng.choice(group["query_id"].to_numpy(), size=len(group)))
    groups = dict(tuple(traces.groupby("query_id", sort=False)))
    parts = [groups[query].assign(query_id=new) for new, query in enumerate(picked)]
    return pd.concat(parts, ignore_index=True).astype({"query_id": traces["query_id"].dtype})
