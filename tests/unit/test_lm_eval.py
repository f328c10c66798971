"""lm-evaluation-harness's `hf` model type scores an export on a local text file, offline (slow)."""

from __future__ import annotations

import json
import math
import os

import pytest
from export_helpers import train_small

from tiny_llm.cli import main
from tiny_llm.data.sources import resolve_source

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

TASK = """task: tiny_llm_text
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


def test_lm_eval_perplexity_agrees_with_tiny_llm_evaluate(
    tiny_cache, tiny_recipe_args, tiny_corpus_dir, tmp_path, capsys, monkeypatch
):
    if os.environ.get("TINY_LLM_REQUIRE_LM_EVAL"):  # CI installs it (the dev extra): a missing one fails
        import accelerate  # noqa: F401
        import lm_eval
    else:
        lm_eval = pytest.importorskip("lm_eval")
        pytest.importorskip("accelerate")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    train_small(tiny_cache, tiny_recipe_args, tmp_path / "run")
    export = tmp_path / "export"
    assert main(["export", "--run", str(tmp_path / "run"), "--output", str(export)]) == 0
    # The validation split's documents, in the cache's order, in a file beside the export.
    texts = [
        t for batch in resolve_source(str(tiny_corpus_dir), None).iter_texts("validation", 64) for t in batch
    ]
    (export / "eval.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (export / "tiny_llm_text.yaml").write_text(TASK.format(data=export / "eval.jsonl"))
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={export},dtype=float32",
        tasks=["tiny_llm_text"],
        task_manager=TaskManager(include_path=str(export)),
        device="cpu",
        batch_size=8,
        log_samples=True,
    )
    samples = out["samples"]["tiny_llm_text"]
    assert len(samples) == len(texts)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(export))
    loglikelihood = sum(float(s["filtered_resps"][0]) for s in samples)
    tokens = sum(len(tokenizer(t)["input_ids"]) for t in texts)
    theirs = -loglikelihood / tokens  # nats per document token, each document after an EOS
    capsys.readouterr()
    argv = ["evaluate", "--config", str(tmp_path / "run" / "resolved.yaml")]
    assert main([*argv, "--checkpoint", str(tmp_path / "run" / "final.pt"), "--full"]) == 0
    ours = json.loads(capsys.readouterr().out)
    # Ours: the validation stream in 64-token blocks, EOS targets included; theirs: each document alone
    # (measured: 5.3517 vs 5.3535 nats per token).
    print(f"lm-eval {theirs:.4f} nats/token ({tokens} tokens), tiny_llm evaluate {ours['loss']:.4f}")
    assert theirs == pytest.approx(ours["loss"], rel=0.01)
    bits = out["results"]["tiny_llm_text"]["bits_per_byte,none"]
    assert bits == pytest.approx(-loglikelihood / math.log(2) / sum(len(t.encode()) for t in texts), rel=1e-6)
    # Bits per byte: both leave the EOS predictions out and divide by the documents' UTF-8 bytes.
    print(f"lm-eval {bits:.4f} bits/byte, tiny_llm evaluate {ours['bpb']:.4f}")
    assert ours["bpb"] == pytest.approx(bits, rel=0.01)
