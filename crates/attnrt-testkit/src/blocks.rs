//! One attention block as TorchScript exports it, with skip-through nodes (`Identity`,
//! `Dropout`, same-type `Cast`) put where a test asks: the shared fixture of the fusion
//! crate's structural tests and the workspace's numeric tests of skip-through fusion.
//!
//! ```text
//! x [B, L, 32] → MatMul(Wq|Wk|Wv) → Reshape [B, L, 4, 8] → Transpose (K: [0,2,3,1])
//!   → MatMul(Q, Kᵀ) → Div(√8) → Softmax → MatMul(·, V) → Transpose → Reshape [B, L, 32] → y
//! ```

use attnrt_onnx::{attr, DataType, ModelProto};

use crate::{
    node_with_attrs, seeded_values, tensor_bool, tensor_f32, tensor_i64_1d, value_info,
    GraphBuilder,
};

/// Model width, heads and head size of the block.
pub const D_MODEL: i64 = 32;
/// Heads.
pub const HEADS: i64 = 4;
/// Head size.
pub const HEAD_SIZE: i64 = 8;

/// Where a skip-through node stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipAt {
    /// On Q after the head split, before the QK MatMul.
    Q,
    /// On the scores, between the scale and the Softmax.
    Scores,
    /// On the probabilities, between the Softmax and the context MatMul.
    Probs,
    /// On the context, between the context MatMul and the head merge.
    Context,
}

/// A node that is (or, for a training-mode `Dropout`, is not) the identity at inference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// `Identity`.
    Identity,
    /// `Dropout(x, ratio 0.1[, training_mode])`: `None` leaves `training_mode` out (it
    /// defaults to false), `Some(b)` gives it as a constant.
    Dropout(Option<bool>),
    /// `Dropout` whose `training_mode` is a graph input (`training: bool[]`), unknown before
    /// run time.
    DropoutRuntimeMode,
    /// `Cast` to float, the type the tensor already has.
    SameTypeCast,
}

/// The block with `skips` inserted, in that order at each place; the nodes are named
/// `<Op>_<place>_<i>` (`Dropout_probs_0`), the output is `y`, the input `x` (and `training`
/// for [`Skip::DropoutRuntimeMode`]). Opset 17, `B` and `L` symbolic.
pub fn skip_block(skips: &[(SkipAt, Skip)]) -> ModelProto {
    let mut b = Block {
        g: GraphBuilder::new("skip_block"),
        skips,
    };
    let x =
        b.g.input(value_info("x", DataType::Float, &["B", "L", "32"]));
    let (q, k, v) = (
        b.project(&x, "q", 1),
        b.project(&x, "k", 2),
        b.project(&x, "v", 3),
    );
    let q4 = b.split(&q, "q", &[0, 2, 1, 3]);
    let q4 = b.skip(SkipAt::Q, q4);
    let kt = b.split(&k, "k", &[0, 2, 3, 1]);
    let v4 = b.split(&v, "v", &[0, 2, 1, 3]);
    let s = b.op("MatMul", "qk", &[&q4, &kt], vec![]);
    let sqrt_d =
        b.g.initializer(tensor_f32("sqrt_d", &[], &[(HEAD_SIZE as f32).sqrt()]));
    let s = b.op("Div", "scale", &[&s, &sqrt_d], vec![]);
    let s = b.skip(SkipAt::Scores, s);
    let p = b.op(
        "Softmax",
        "softmax",
        &[&s],
        vec![attr::make_int("axis", -1)],
    );
    let p = b.skip(SkipAt::Probs, p);
    let c = b.op("MatMul", "context", &[&p, &v4], vec![]);
    let c = b.skip(SkipAt::Context, c);
    let t = b.op(
        "Transpose",
        "merge",
        &[&c],
        vec![attr::make_ints("perm", &[0, 2, 1, 3])],
    );
    let shape = b.g.initializer(tensor_i64_1d("merged", &[0, -1, D_MODEL]));
    b.g.node(node_with_attrs(
        "Reshape_merge",
        "Reshape",
        &[&t, &shape],
        &["y"],
        vec![],
    ));
    b.g.output(value_info("y", DataType::Float, &["B", "L", "32"]));
    b.g.into_model(17)
}

struct Block<'s> {
    g: GraphBuilder,
    skips: &'s [(SkipAt, Skip)],
}

impl Block<'_> {
    fn op(
        &mut self,
        op: &str,
        tag: &str,
        inputs: &[&str],
        attrs: Vec<attnrt_onnx::AttributeProto>,
    ) -> String {
        let out = format!("{tag}_out");
        self.g.node(node_with_attrs(
            &format!("{op}_{tag}"),
            op,
            inputs,
            &[&out],
            attrs,
        ))
    }

    /// `x · W` with a seeded `[32, 32]` weight.
    fn project(&mut self, x: &str, what: &str, seed: u32) -> String {
        let w = seeded_values((D_MODEL * D_MODEL) as usize, seed)
            .iter()
            .map(|v| v * 0.3)
            .collect::<Vec<_>>();
        let w = self
            .g
            .initializer(tensor_f32(&format!("W{what}"), &[D_MODEL, D_MODEL], &w));
        self.op("MatMul", &format!("proj_{what}"), &[x, &w], vec![])
    }

    /// `Transpose(Reshape(x, [0, -1, 4, 8]), perm)`.
    fn split(&mut self, x: &str, what: &str, perm: &[i64]) -> String {
        let shape = self.g.initializer(tensor_i64_1d(
            &format!("split_{what}"),
            &[0, -1, HEADS, HEAD_SIZE],
        ));
        let r = self.op("Reshape", &format!("split_{what}"), &[x, &shape], vec![]);
        self.op(
            "Transpose",
            &format!("heads_{what}"),
            &[&r],
            vec![attr::make_ints("perm", perm)],
        )
    }

    /// `x` through the skip-through nodes asked for at `at`.
    fn skip(&mut self, at: SkipAt, mut x: String) -> String {
        let place = format!("{at:?}").to_lowercase();
        let here: Vec<Skip> = self
            .skips
            .iter()
            .filter(|(a, _)| *a == at)
            .map(|(_, s)| *s)
            .collect();
        for (i, s) in here.into_iter().enumerate() {
            let tag = format!("{place}_{i}");
            x = match s {
                Skip::Identity => self.op("Identity", &tag, &[&x], vec![]),
                Skip::SameTypeCast => self.op(
                    "Cast",
                    &tag,
                    &[&x],
                    vec![attr::make_int("to", DataType::Float as i64)],
                ),
                Skip::Dropout(mode) => {
                    let ratio =
                        self.g
                            .initializer(tensor_f32(&format!("ratio_{tag}"), &[], &[0.1]));
                    let mut inputs = vec![x.clone(), ratio];
                    if let Some(m) = mode {
                        inputs.push(self.g.initializer(tensor_bool(
                            &format!("mode_{tag}"),
                            &[],
                            &[m],
                        )));
                    }
                    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
                    self.op("Dropout", &tag, &inputs, vec![])
                }
                Skip::DropoutRuntimeMode => {
                    let ratio =
                        self.g
                            .initializer(tensor_f32(&format!("ratio_{tag}"), &[], &[0.1]));
                    let mode = self
                        .g
                        .input(value_info("training", DataType::Bool, &[] as &[i64]));
                    self.op("Dropout", &tag, &[&x, &ratio, &mode], vec![])
                }
            };
        }
        x
    }
}
