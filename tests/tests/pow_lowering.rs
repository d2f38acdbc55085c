//! The shipped models with a `Pow` (GPT-2's tanh GELU `x³`, LLaMA's and T5's RMSNorm `x²`),
//! run with that `Pow` as multiplications (the default, crates/attnrt-runtime/src/lower/
//! pow.rs) and with tract's `powf`, on their saved inputs: the outputs agree within the
//! fused-vs-unfused tolerance of tests/models.rs, and the lowered session runs no `PowConst`.

use attnrt::harness::{diff_outputs, read_npz_tensors, Tolerance};
use attnrt_onnx::{load_model, Limits};
use attnrt_runtime::{Session, SessionOptions, Threads};
use attnrt_tests::models_dir;

/// As tests/models.rs's fused vs unfused.
const TOLERANCE: Tolerance = Tolerance {
    atol: 2e-5,
    rtol: 1e-4,
};

#[test]
fn models_with_pow_give_the_same_outputs_lowered() {
    let threads = Threads::new(None).unwrap();
    let cases = [
        ("gpt2_eager.ts.onnx", "gpt2_eager.inputs.npz"),
        ("gpt2_eager.dynamo.onnx", "gpt2_eager.inputs.npz"),
        ("llama_eager.ts.onnx", "llama_eager.inputs.npz"),
    ];
    for (file, inputs) in cases {
        let model = load_model(&models_dir().join(file), &Limits::default())
            .unwrap()
            .model;
        let inputs = read_npz_tensors(&models_dir().join(inputs), 1 << 28).unwrap();
        let run = |pow_as_mul| {
            let options = SessionOptions {
                pow_as_mul,
                ..SessionOptions::default()
            };
            let s = Session::new(&model, &threads, file, &options).unwrap();
            let out = s.run(&inputs).unwrap();
            (out, s.op_names())
        };
        let (lowered, lowered_ops) = run(true);
        let (reference, reference_ops) = run(false);
        for d in diff_outputs(&lowered, &reference, TOLERANCE) {
            assert!(
                d.ok,
                "{file}: output '{}': max_abs {:.3e}",
                d.name, d.max_abs
            );
        }
        let pow_consts = |ops: &[String]| ops.iter().filter(|o| *o == "PowConst").count();
        assert_eq!(pow_consts(&lowered_ops), 0, "{file} lowered");
        if file.starts_with("gpt2") {
            assert!(pow_consts(&reference_ops) > 0, "{file}: {reference_ops:?}");
        }
    }
}
