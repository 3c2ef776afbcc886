"""The peers benchmark's own rows (``benchmarks.peers.ours``): vanilla, n-gram and each drafter trained
for the model at its deployed shape, greedy and so equal to vanilla; a drafter not trained is noted."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.peers import ours
from core.models import folder_spec
from real_engine.tokenizer import Tokenizer


def test_our_rows_run_the_models_trained_drafters_and_note_the_others(llama_dir: Path, draft_dir: Path,
                                                                       tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(llama_dir, folder)
    shutil.copytree(draft_dir, folder / "drafters" / "draft")
    spec = folder_spec(folder)
    notes: list[str] = []
    engines = ours(spec, "float32", Tokenizer.load(folder), 12, ("draft-model", "eagle"), notes)
    assert [e.name for e in engines] == ["specblock vanilla", "specblock n-gram", "specblock draft-model"]
    assert len(notes) == 1 and notes[0].startswith("eagle:") and "specblock train eagle" in notes[0]
    prompt = [5, 9, 13, 5, 9, 13, 5, 9]
    vanilla = engines[0].run(prompt)
    assert len(vanilla) > 0 and all(e.run(prompt) == vanilla for e in engines[1:])
