"""The `attnrt` Python package (crates/attnrt-python), as a user of onnxruntime would use it.

scripts/test.sh builds the wheel with maturin, installs it into the test venv and runs this file
with pytest (ATTNRT_BIN: the `attnrt` binary of the same build, for the CLI comparison).

Tolerance against onnxruntime: |a - b| <= 1e-4 + 1e-4*|b| (both run float32; the exports agree
with PyTorch to <= 6.2e-6 in onnxruntime, models/manifest.json).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import attnrt

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
MANIFEST = json.loads((MODELS / "manifest.json").read_text())["models"]
ATOL = RTOL = 1e-4


def cases():
    for m in MANIFEST:
        for c in m["cases"]:
            yield pytest.param(m["file"], c["inputs_npz"], id=f"{m['file']}[{c['name']}]")


def feeds(npz: str) -> dict:
    with np.load(MODELS / npz) as d:
        return {k: d[k] for k in d.files}


@pytest.fixture(scope="module")
def ort_sessions():
    cache = {}

    def get(file: str) -> ort.InferenceSession:
        if file not in cache:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 2
            cache[file] = ort.InferenceSession(str(MODELS / file), opts, providers=["CPUExecutionProvider"])
        return cache[file]

    return get


@pytest.mark.parametrize("file,inputs_npz", list(cases()))
def test_fused_outputs_equal_onnxruntime(file, inputs_npz, ort_sessions):
    ref = ort_sessions(file)
    sess = attnrt.InferenceSession(str(MODELS / file), threads=2)
    # Swapping the class is all it takes: the same call, the same names, the same order.
    feed = {i.name: v for i, v in zip(ref.get_inputs(), [feeds(inputs_npz)[i.name] for i in ref.get_inputs()])}
    want = ref.run(None, feed)
    got = sess.run(None, feed)
    assert [o.name for o in sess.get_outputs()] == [o.name for o in ref.get_outputs()]
    assert len(got) == len(want)
    for name, g, w in zip([o.name for o in ref.get_outputs()], got, want):
        assert g.dtype == w.dtype, name
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=RTOL, err_msg=f"{file} output {name}")


def test_inputs_and_outputs_look_like_onnxruntime(ort_sessions):
    file = "bert_eager.ts.onnx"
    ref = ort_sessions(file)
    sess = attnrt.InferenceSession(MODELS / file)
    for mine, theirs in [(sess.get_inputs(), ref.get_inputs()), (sess.get_outputs(), ref.get_outputs())]:
        assert [(a.name, a.shape, a.type) for a in mine] == [(a.name, a.shape, a.type) for a in theirs]
    assert sess.fusion_report is not None and len(sess.fusion_report.blocks) == 2


def test_one_session_serves_every_shape():
    sess = attnrt.InferenceSession(MODELS / "mha_seed.ts.onnx", threads=1)
    unfused = attnrt.InferenceSession(MODELS / "mha_seed.ts.onnx", fuse=False, threads=1)
    rng = np.random.default_rng(0)
    for shape in [(2, 10, 64), (1, 3, 64), (3, 17, 64)]:
        x = rng.standard_normal(shape, dtype=np.float32)
        (y,) = sess.run(["output"], {"x": x})
        (r,) = unfused.run(None, {"x": x})
        assert y.shape == shape
        np.testing.assert_allclose(y, r, atol=2e-5, rtol=1e-4)


def test_report_matches_the_cli(tmp_path):
    binary = os.environ.get("ATTNRT_BIN")
    if not binary:
        pytest.fail("ATTNRT_BIN is not set: run the suite with scripts/test.sh")
    model = MODELS / "gpt2_cache_eager.ts.onnx"
    out = tmp_path / "fused.onnx"
    cli = subprocess.run([binary, "fuse", str(model), "-o", str(out), "--json"],
                         capture_output=True, text=True, check=True)
    cli_report = json.loads(cli.stdout)["report"]
    fused, report = attnrt.fuse(model)
    assert report.as_dict() == cli_report
    assert fused == out.read_bytes()
    # Bytes in, a path out: the written model is the same model.
    path, again = attnrt.fuse(model.read_bytes(), output=tmp_path / "again.onnx")
    assert Path(path).read_bytes() == fused and again.as_dict() == cli_report


def test_fused_model_runs_in_onnxruntime(tmp_path):
    model = MODELS / "bert_sdpa.ts.onnx"
    path, report = attnrt.fuse(model, output=tmp_path / "fused.onnx")
    assert len(report.blocks) == 2
    feed = feeds("bert_sdpa.inputs.npz")
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feed)
    got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feed)
    np.testing.assert_allclose(got[0], want[0], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", ["bert_eager", "gpt2_eager"])
def test_quantized_models_fuse_and_stay_exact(tmp_path, name):
    """ONNX Runtime's dynamic int8 quantizer names the dims it infers `unk__N`; fusion proves
    shapes from the values (through DynamicQuantizeLinear, MatMulInteger, DequantizeLinear), so
    every block of the quantized file still fuses, and the fused run equals the unfused one.
    (Not compared with ONNX Runtime: on a CPU without VNNI its u8×s8 kernels saturate 16-bit
    pair sums, and its outputs differ from the exact integer arithmetic by up to 0.7 here.)"""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = tmp_path / f"{name}.qint8.onnx"
    quantize_dynamic(
        str(MODELS / f"{name}.ts.onnx"), str(quantized), weight_type=QuantType.QInt8, per_channel=True
    )
    _, report = attnrt.fuse(quantized)
    assert len(report.blocks) == 2, report.as_dict()
    feed = feeds(f"{name}.inputs.npz")
    (want,) = attnrt.InferenceSession(quantized, fuse=False).run(None, feed)
    (got,) = attnrt.InferenceSession(quantized).run(None, feed)
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)


def test_a_merged_decoder_fuses_inside_its_branches_and_runs_in_onnxruntime(tmp_path):
    """optimum's merged decoder keeps its blocks in the two branches of one If: each branch is
    fused (the report names it), the emitted model passes the ONNX checker, and ONNX Runtime and
    attnrt give PyTorch's outputs on either branch."""
    import onnx

    model = MODELS / "whisper_optimum.decoder_merged.onnx"
    path, report = attnrt.fuse(model, output=tmp_path / "fused.onnx")
    assert len(report.blocks) == 8
    branches = {b["softmax"].split(": ")[0] for b in report.blocks}
    assert branches == {"optimum::if/then_branch", "optimum::if/else_branch"}, branches
    onnx.checker.check_model(onnx.load(path), full_check=True)
    fused_ort = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    sess = attnrt.InferenceSession(model)
    for case in ("prefill", "decode_p4_n1"):
        feed = feeds(f"whisper_optimum.decoder_merged.{case}.inputs.npz")
        with np.load(MODELS / f"whisper_optimum.decoder_merged.{case}.outputs.npz") as want:
            for got in (dict(zip([o.name for o in fused_ort.get_outputs()], fused_ort.run(None, feed))),
                        dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))):
                for name in want.files:
                    np.testing.assert_allclose(got[name], want[name], atol=ATOL, rtol=RTOL)


def near_miss_model() -> bytes:
    """Q·Kᵀ → Softmax over the query axis (axis 2) → ·V: attention-shaped, never fused."""
    from onnx import TensorProto, helper

    qkv = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 4, 8]) for n in "qkv"]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 8])
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], name="sm", axis=2),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "near_miss", qkv, [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_explain_prints_every_near_miss(capsys):
    _, report = attnrt.fuse(near_miss_model(), explain=True)
    printed = capsys.readouterr().out
    assert report.near_misses, "the Softmax over the query axis is not attention"
    assert report.near_misses[0]["check"] == "softmax-axis"
    assert "0 block(s) fused, 1 not fused" in printed
    for m in report.near_misses:
        assert m["node"] in printed and m["check"] in printed


@pytest.mark.parametrize(
    "source,message",
    [
        ("/nonexistent/model.onnx", "/nonexistent/model.onnx"),
        (b"this is not an onnx model", "<bytes>"),
        (str(MODELS), str(MODELS)),
    ],
)
def test_bad_models_raise_a_clear_error(source, message):
    with pytest.raises(attnrt.AttnrtError) as e:
        attnrt.InferenceSession(source)
    assert message in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(attnrt.AttnrtError):
        attnrt.fuse(source)


@pytest.fixture(scope="module")
def bert():
    return attnrt.InferenceSession(MODELS / "bert_eager.ts.onnx"), feeds("bert_eager.inputs.npz")


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda f: {**f, "token_type_ids": f["input_ids"]}, "not an input of the model"),
        (lambda f: {"input_ids": f["input_ids"]}, "input 'attention_mask' is not fed"),
        (lambda f: {**f, "input_ids": f["input_ids"].astype(np.int32)}, "feed 'input_ids' is int32, the model declares int64"),
        (lambda f: {**f, "input_ids": f["input_ids"][0]}, "feed 'input_ids' has shape"),
        (lambda f: {**f, "input_ids": f["input_ids"].tolist()}, "not a numpy array"),
        # names are hints: the run goes on (with a warning) and fails where the shapes meet
        (lambda f: {**f, "input_ids": f["input_ids"][:, :5]}, "attn_mask has 10 keys but there are only 5"),
    ],
    ids=["unknown name", "missing input", "wrong dtype", "wrong rank", "not an array", "shapes disagree"],
)
@pytest.mark.filterwarnings("ignore:feed 'attention_mask' has 10 on axis 1")
def test_wrong_feeds_raise(bert, change, message):
    sess, good = bert
    with pytest.raises(attnrt.AttnrtError) as e:
        sess.run(None, change(good))
    assert message in str(e.value), str(e.value)


def test_dim_names_are_hints(tmp_path):
    """optimum names a cache decoder's mask axis like input_ids' (`sequence_length`), though
    with a cache the mask is longer: the run goes on with a warning, and is exact."""
    import onnx

    model = onnx.load(str(MODELS / "gpt2_cache_eager.ts.onnx"))
    (mask,) = [i for i in model.graph.input if i.name == "attention_mask"]
    mask.type.tensor_type.shape.dim[1].dim_param = "sequence"
    path = tmp_path / "renamed.onnx"
    onnx.save(model, str(path))
    sess = attnrt.InferenceSession(path)
    good = feeds("gpt2_cache_eager.decode_p5_n3.inputs.npz")
    with pytest.warns(UserWarning, match="feed 'attention_mask' has 8 on axis 1, where 'sequence' = 3"):
        got = sess.run(None, good)
    with np.load(MODELS / "gpt2_cache_eager.decode_p5_n3.outputs.npz") as want:
        for name, value in zip(sess.get_outputs(), got):
            np.testing.assert_allclose(value, want[name.name], atol=ATOL, rtol=RTOL)


def test_unknown_output_name_raises(bert):
    sess, good = bert
    with pytest.raises(attnrt.AttnrtError, match="not outputs of the model"):
        sess.run(["logits"], good)


def test_a_session_is_usable_from_several_threads(bert):
    sess, good = bert
    (want,) = sess.run(None, good)
    rng = np.random.default_rng(1)
    other = {"input_ids": rng.integers(0, 100, (1, 7)), "attention_mask": np.ones((1, 7), dtype=np.int64)}
    (want_other,) = sess.run(None, other)
    running = threading.Barrier(4)

    def job(i: int):
        running.wait()
        feed = good if i % 2 == 0 else other
        return i, sess.run(None, feed)[0]

    with ThreadPoolExecutor(4) as pool:
        for i, got in pool.map(job, range(4)):
            np.testing.assert_array_equal(got, want if i % 2 == 0 else want_other)


def test_gelu_is_fused_unless_turned_off():
    model = MODELS / "gpt2_eager.ts.onnx"
    _, report = attnrt.fuse(model)
    assert [a["rule"] for a in report.activations] == ["gelu[tanh]", "gelu[tanh]"]
    _, plain = attnrt.fuse(model, gelu=False)
    assert plain.activations == [] and len(plain.blocks) == len(report.blocks)


def test_a_run_over_max_memory_raises_before_it_starts(bert):
    _, good = bert
    small = attnrt.InferenceSession(MODELS / "bert_eager.ts.onnx", max_memory="4K")
    with pytest.raises(attnrt.AttnrtError) as e:
        small.run(None, good)
    message = str(e.value)
    assert "over the memory budget of 4.0 KiB (max_memory=)" in message, message
    assert "needs" in message and "\n" not in message, message
    # In bytes, and large enough: it runs.
    roomy = attnrt.InferenceSession(MODELS / "bert_eager.ts.onnx", max_memory=64 << 20)
    assert roomy.run(None, good)[0].shape[:2] == good["input_ids"].shape
    with pytest.raises(attnrt.AttnrtError, match="max_memory: 'lots' is not a size"):
        attnrt.InferenceSession(MODELS / "bert_eager.ts.onnx", max_memory="lots")
