//! Grouped-query attention: K and V heads repeated up to the Q heads before the products.
//!
//! ```text
//! K4 = Reshape(Expand(Unsqueeze(KV, [2]), [B, Hkv, n, L, D]), [B, Hkv·n, L, D])
//! ```
//!
//! (LLaMA's `repeat_kv`). The fused node reads K and V before the repeat, with
//! `kv_num_heads = Hkv`; both K and V must be un-repeated, or neither (the op takes one
//! `kv_num_heads`).

use attnrt_onnx::attr;

use super::k_transpose::KInput;
use crate::graph::GraphView;

/// K and V before their repeat: what the fused node reads, with `kv_num_heads` the heads
/// before it.
#[derive(Clone, Debug)]
pub struct BeforeRepeat {
    /// K before the repeat (read as it is: no transpose).
    pub k: KInput,
    /// V before the repeat.
    pub v: String,
}

/// K and V before their repeat, when both are repeated and K needs no transpose.
pub fn before_repeat(view: &GraphView, k: &KInput, v: &str) -> Option<BeforeRepeat> {
    if k.perm.is_some() {
        return None;
    }
    let kv = unrepeat(view, &k.source)?;
    let vv = unrepeat(view, v)?;
    Some(BeforeRepeat {
        k: KInput {
            source: kv,
            perm: None,
        },
        v: vv,
    })
}

/// The tensor `kv` with `k4 = Reshape(Expand(Unsqueeze(kv, [2]), …), …)` repeating its heads.
fn unrepeat(view: &GraphView, k4: &str) -> Option<String> {
    // Skip-through nodes may stand between the three.
    let producer = |t: &str| view.producer(&view.skip_producers(t).0);
    let rn = view.node(view.producer(k4)?);
    if rn.op_type != "Reshape" {
        return None;
    }
    let en = view.node(producer(rn.input.first()?)?);
    if en.op_type != "Expand" {
        return None;
    }
    let un = view.node(producer(en.input.first()?)?);
    if un.op_type != "Unsqueeze" {
        return None;
    }
    let axes = match attr::ints(un, "axes").ok().flatten() {
        Some(a) => a.to_vec(),
        None => view.value(un.input.get(1)?)?.known_ints()?,
    };
    if axes != [2] {
        return None;
    }
    let kv = un.input.first()?;
    let (ks, es, os) = (
        view.shape(kv)?,
        view.shape(en.output.first()?)?,
        view.shape(k4)?,
    );
    if ks.len() != 4 || es.len() != 5 || os.len() != 4 {
        return None;
    }
    let n = &es[2];
    let ok = es[0] == ks[0]
        && es[1] == ks[1]
        && es[3] == ks[2]
        && es[4] == ks[3]
        && os[0] == ks[0]
        && Some(&os[1]) == ks[1].mul(n).as_ref()
        && os[2] == ks[2]
        && os[3] == ks[3];
    ok.then(|| kv.clone())
}
