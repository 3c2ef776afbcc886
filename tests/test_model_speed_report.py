"""`benchmarks/model_speed.py`'s report renders the committed results file: its own markdown (written after
the measurement, so a rendering error would lose a run's report) and its docs/results.md section."""

import json

from benchmarks.model_speed import RENDERERS, markdown
from core.paths import RESULTS


def test_the_committed_run_renders_both_ways() -> None:
    record = json.loads((RESULTS / "model_speed.json").read_text())
    text = markdown(record["results"], record["config"])
    copy = record["results"]["bandwidth"]["copy"]
    assert f"1 GiB copy {copy['mean'] / 1e9:.1f} [" in text
    assert text.count("| float32 |") >= 2 and text.count("| bfloat16 |") >= 2
    body = "\n".join(RENDERERS["model_speed"].body(record))
    assert f"a 1 GiB copy {copy['mean'] / 1e9:.1f} [" in body
