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


def test_the_kv_cache_copied_gives_the_in_place_tokens():
    model = attnrt.Model(MODELS / "llama_cache_eager.ts.onnx", threads=1)
    reports = {}
    for mode in ("in-place", "copy"):
        params = attnrt.GeneratorParams(model)
        params.set_search_options(max_new_tokens=6, kv_cache=mode)
        generator = attnrt.Generator(model, params)
        generator.append_tokens([[3, 14, 15], [9, 2, 6, 5, 35]])
        list(generator)
        reports[mode] = generator.report()
        assert reports[mode]["kv_cache"]["mode"] == mode
    assert reports["copy"]["rows"] == reports["in-place"]["rows"]
    with pytest.raises(attnrt.AttnrtError, match="'paged'"):
        attnrt.generate(model, [1, 2], max_new_tokens=2, kv_cache="paged")


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


# Encoder–decoder pairs (issue 25 item 4): optimum's tiny Whisper (merged decoder, and the
# decoder with past with the decoder that makes its first step), BART and T5 (merged decoder,
# which also takes the encoder's attention mask; their encoder batch has a row padded on the
# right). Their greedy tokens are PyTorch's (models/*.greedy.npz, written by the export scripts:
# transformers' encoder once, then its decoder with its cache), fused and unfused alike.

WHISPER = {
    "merged": dict(model="whisper_optimum.decoder_merged.onnx"),
    "two_file": dict(
        model="whisper_optimum.decoder_with_past.onnx", first_step="whisper_optimum.decoder.onnx"
    ),
}


def whisper_reference():
    """PyTorch's greedy tokens and decoder start ids (one row each), and the encoder inputs of
    those rows: the saved case's features scaled per row."""
    greedy = np.load(MODELS / "whisper_optimum.greedy.npz")
    features = np.load(MODELS / "whisper_optimum.encoder.case.inputs.npz")["input_features"]
    rows = [features * scale for scale in greedy["scales"]]
    return greedy["decoder_start_ids"].tolist(), greedy["tokens"].tolist(), rows


def pair(files: dict, encoder: str, fuse: bool) -> attnrt.Model:
    parts = {k: MODELS / v for k, v in files.items()}
    return attnrt.Model(parts.pop("model"), encoder=MODELS / encoder, fuse=fuse, threads=2, **parts)


@pytest.mark.parametrize("form", sorted(WHISPER))
@pytest.mark.parametrize("fuse", [True, False])
def test_whisper_generates_pytorchs_greedy_tokens(form, fuse):
    starts, want, features = whisper_reference()
    model = pair(WHISPER[form], "whisper_optimum.encoder.onnx", fuse)
    for part in ["decoder", "encoder"] + (["first_step"] if form == "two_file" else []):
        report = model.fusion_report(part)
        assert (report is not None and report["blocks"]) if fuse else report is None, part
    n = len(want[0])
    batch = {"input_features": np.concatenate(features)}
    assert attnrt.generate(model, starts, max_new_tokens=n, encoder_inputs=batch) == want
    # each row alone, through the onnxruntime-genai-shaped loop
    for row in range(2):
        params = attnrt.GeneratorParams(model)
        params.set_search_options(max_new_tokens=n)
        params.set_encoder_inputs({"input_features": features[row]})
        generator = attnrt.Generator(model, params)
        generator.append_tokens(starts[row])
        made = [tokens[0] for tokens in generator]
        assert made == want[row], f"row {row}"
        assert generator.get_sequence(0) == starts[row] + want[row]
        report = generator.report()
        assert report["encoder_ms"] > 0 and report["stopped"] == "max_new_tokens"
        assert [s["past"] for s in report["steps"][:3]] == [0, 3, 4], "the cache grows"


def test_the_tokens_depend_on_the_encoder_inputs():
    starts, want, features = whisper_reference()
    model = pair(WHISPER["merged"], "whisper_optimum.encoder.onnx", True)
    silent = {"input_features": np.zeros_like(features[0])}
    made = attnrt.generate(model, starts[0], max_new_tokens=len(want[0]), encoder_inputs=silent)
    assert made != want[0]


@pytest.mark.parametrize("name", ["bart_optimum", "t5_optimum"])
@pytest.mark.parametrize("fuse", [True, False])
def test_bart_and_t5_generate_pytorchs_greedy_tokens(name, fuse):
    saved = np.load(MODELS / f"{name}.greedy.npz")
    model = pair(dict(model=f"{name}.decoder_merged.onnx"), f"{name}.encoder.onnx", fuse)
    assert bool(model.fusion_report("encoder")) == fuse
    inputs = {k: saved[k] for k in ("input_ids", "attention_mask")}
    want = saved["tokens"].tolist()
    starts = saved["decoder_start_ids"].tolist()
    assert attnrt.generate(model, starts, max_new_tokens=len(want[0]), encoder_inputs=inputs) == want


def test_bad_pairs_raise_with_the_file_and_input_named():
    merged, encoder = MODELS / "whisper_optimum.decoder_merged.onnx", MODELS / "whisper_optimum.encoder.onnx"
    with_past, first = MODELS / "whisper_optimum.decoder_with_past.onnx", MODELS / "whisper_optimum.decoder.onnx"
    gpt2 = MODELS / "gpt2_cache_eager.ts.onnx"
    refused = [
        # a decoder that takes the encoder's states, given no encoder
        (dict(model=merged), "whisper_optimum.decoder_merged.onnx: takes the encoder's states.*encoder="),
        # the decoder with past cannot make its first step
        (dict(model=with_past, encoder=encoder), "past_key_values.0.encoder.key.*first_step="),
        (dict(model=with_past, first_step=first), "give its encoder"),
        # a decoder-only model has nothing for an encoder to feed
        (dict(model=gpt2, encoder=encoder), "gpt2_cache_eager.ts.onnx: takes no encoder states.*nothing to feed"),
        # an "encoder" none of whose outputs gives the decoder's states
        (dict(model=merged, encoder=gpt2), "none of its outputs.*'encoder_hidden_states'"),
        # a first step that does not give the presents the decoder takes
        (dict(model=with_past, encoder=encoder, first_step=encoder), "gives no output 'logits'"),
    ]
    for kwargs, message in refused:
        with pytest.raises(attnrt.AttnrtError, match=message):
            attnrt.Model(kwargs.pop("model"), fuse=False, **kwargs)
    starts, _, features = whisper_reference()
    model = attnrt.Model(merged, encoder=encoder, fuse=False)
    with pytest.raises(attnrt.AttnrtError, match="no inputs given"):
        attnrt.generate(model, starts[0], max_new_tokens=2)
    with pytest.raises(attnrt.AttnrtError, match=r"last_hidden_state.*2 row\(s\)"):
        attnrt.generate(model, starts, max_new_tokens=2, encoder_inputs={"input_features": features[0]})
    with pytest.raises(attnrt.AttnrtError, match="feed 'input_features' is a list"):
        attnrt.generate(model, starts[0], max_new_tokens=2, encoder_inputs={"input_features": [1.0]})
    with pytest.raises(attnrt.AttnrtError, match="encoder inputs given, but no encoder"):
        attnrt.generate(attnrt.Model(gpt2), [1, 2], max_new_tokens=2, encoder_inputs={"x": features[0]})
    generator = attnrt.Generator(model, attnrt.GeneratorParams(model))
    generator.set_encoder_inputs({"input_features": features[0]})
    generator.append_tokens(starts[0])
    with pytest.raises(attnrt.AttnrtError, match="give them before append_tokens"):
        generator.set_encoder_inputs({"input_features": features[1]})
    with pytest.raises(attnrt.AttnrtError, match="no model part 'decoder_with_past'"):
        model.fusion_report("decoder_with_past")
