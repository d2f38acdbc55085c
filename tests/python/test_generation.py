"""attnrt's Python generator (issue 26 item 5): `attnrt.Model`, `GeneratorParams`, `Generator`
and `generate`, shaped after onnxruntime-genai. Greedy tokens are checked against a greedy loop
written here over ONNX Runtime with the model's own cache; batches against each prompt alone;
sampling for determinism and top-k 1 = greedy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import attnrt

MODELS = Path(__file__).resolve().parents[2] / "models"
# The int8 decoders with 7-bit weights (models/quantize.py): ONNX Runtime's integer products are
# exact on them on every CPU, so its greedy loop is a reference for attnrt's.
DECODERS = ["gpt2_cache_eager.ts.onnx", "llama_cache_sdpa.dynamo.onnx",
            "gpt2_cache_eager.ts.qint8rr.onnx", "llama_cache_eager.ts.qint8rr.onnx"]


def ort_greedy(path: Path, prompt: list, n: int) -> list:
    """n greedy tokens from ONNX Runtime, feeding each step's presents back as the past."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in sess.get_inputs()}
    pasts = [name for name in inputs if name.startswith("past_key_values")]
    feed = {}
    for name in pasts:
        _, heads, _, size = inputs[name].shape
        feed[name] = np.zeros((1, heads, 0, size), dtype=np.float32)
    tokens, ids, past = [], list(prompt), 0
    outputs = [o.name for o in sess.get_outputs()]
    for _ in range(n):
        total = past + len(ids)
        feed["input_ids"] = np.array([ids], dtype=np.int64)
        if "attention_mask" in inputs:
            feed["attention_mask"] = np.ones((1, total), dtype=np.int64)
        if "position_ids" in inputs:
            feed["position_ids"] = np.arange(past, total, dtype=np.int64)[None]
        got = dict(zip(outputs, sess.run(None, feed)))
        token = int(np.argmax(got["logits"][0, -1]))
        tokens.append(token)
        for name in pasts:
            feed[name] = got[name.replace("past_key_values", "present")]
        past, ids = total, [token]
    return tokens


@pytest.mark.parametrize("file", DECODERS)
def test_greedy_tokens_equal_an_onnxruntime_loop(file):
    model = attnrt.Model(MODELS / file)
    assert model.fusion_report()["blocks"], "attention was fused"
    prompt = [3, 14, 15, 92, 65]
    want = ort_greedy(MODELS / file, prompt, 6)
    assert attnrt.generate(model, prompt, max_new_tokens=6) == want
    # the same through the onnxruntime-genai-shaped loop
    params = attnrt.GeneratorParams(model)
    params.set_search_options(max_new_tokens=6)
    generator = attnrt.Generator(model, params)
    generator.append_tokens(np.array(prompt))
    made = []
    while not generator.is_done():
        generator.generate_next_token()
        made.append(generator.get_next_tokens()[0])
    assert made == want
    assert generator.get_sequence(0) == prompt + want
    assert generator.report()["stopped"] == "max_new_tokens"


def test_a_batch_gives_each_row_its_prompt_alone_and_rows_stop_at_eos():
    model = attnrt.Model(MODELS / "gpt2_cache_eager.ts.onnx", threads=1)
    prompts = [[1, 2, 3], [9, 8, 7, 6, 5, 4]]
    alone = [attnrt.generate(model, p, max_new_tokens=5) for p in prompts]
    assert attnrt.generate(model, prompts, max_new_tokens=5) == alone
    eos = alone[1][1]
    params = attnrt.GeneratorParams(model)
    params.set_search_options(max_new_tokens=5, eos_token_id=eos)
    generator = attnrt.Generator(model, params)
    generator.append_tokens(prompts)
    steps = list(generator)
    # row 1 made its EOS (at its first or second token): it chooses nothing after
    done = alone[1].index(eos) + 1
    assert all(step[1] is None for step in steps[done:])
    assert generator.get_sequence(1) == prompts[1] + alone[1][:done]


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    model = attnrt.Model(MODELS / "llama_cache_eager.ts.onnx")
    sample = dict(max_new_tokens=8, do_sample=True, temperature=0.9, top_p=0.9, random_seed=4)
    a = attnrt.generate(model, [5, 6, 7], **sample)
    assert a == attnrt.generate(model, [5, 6, 7], **sample)
    assert a != attnrt.generate(model, [5, 6, 7], **{**sample, "random_seed": 5})
    greedy = attnrt.generate(model, [5, 6, 7], max_new_tokens=8)
    assert attnrt.generate(model, [5, 6, 7], max_new_tokens=8, do_sample=True, top_k=1) == greedy


def test_mistakes_raise_attnrt_errors():
    model = attnrt.Model(MODELS / "llama_cache_eager.ts.onnx")
    with pytest.raises(attnrt.AttnrtError, match="unknown search option"):
        attnrt.GeneratorParams(model).set_search_options(num_beams=4)
    with pytest.raises(attnrt.AttnrtError, match="--temperature must be > 0"):
        attnrt.generate(model, [1, 2], max_new_tokens=2, temperature=0.0)
    with pytest.raises(attnrt.AttnrtError, match="no context length"):
        attnrt.generate(model, [1, 2])
    params = attnrt.GeneratorParams(model)
    params.set_search_options(max_new_tokens=2)
    generator = attnrt.Generator(model, params)
    with pytest.raises(attnrt.AttnrtError, match="append_tokens first"):
        generator.generate_next_token()
    with pytest.raises(attnrt.AttnrtError, match="outside the vocabulary"):
        attnrt.generate(model, [1, 100000], max_new_tokens=2)
    with pytest.raises(attnrt.AttnrtError, match="no cache inputs"):
        attnrt.Model(MODELS / "bert_eager.ts.onnx")
