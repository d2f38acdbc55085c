//! `Attention` nodes already in the model (opset-23 exports) whose K and V are a decoder's
//! cache joins `Concat(past, new, axis = 2)` written outside them (directly, or through
//! LLaMA's grouped-query repeat): each takes its joins over, as a fused block does
//! ([`crate::rules::kv_cache`]), reading this step's K and V and the past and producing the
//! joins as its `present` outputs ([`crate::rewrite::give_cache`]). Exact by the op's
//! definition of `present` when:
//!
//! - Q, K and V are 4-D (the joins are, on axis 2; the past is `[B, Hkv, P, D]` as the op's
//!   `past_key` is);
//! - `is_causal` is 0 (with a past the op aligns the triangle bottom-right; a node whose
//!   triangle was top-left over the joined keys would change): nodes with `is_causal` are
//!   left as they are;
//! - after a repeat, the query heads are a multiple of the cache's heads (the op groups query
//!   head `h` with key head `h / (Hq / Hkv)`, as `repeat_kv` does);
//! - no `nonpad_kv_seqlen` (opset 24) is given;
//! - nothing the node reads is computed from the joins other than through a `Shape` the
//!   rewrite recomputes ([`crate::rules::kv_cache::takeover`]).
//!
//! The mask spans the same keys before and after (`P + L`). Each node taken over, or left with
//! its reason, is a note of the report. The nodes this crate emits (`attnrt/…`) are not
//! looked at: their rule already decided.

use anyhow::{Context, Result};
use attnrt_onnx::{attr, node_label, opset, validate::topo_order, validate_model, ModelProto};

use crate::graph::GraphView;
use crate::report::FusionReport;
use crate::rewrite;
use crate::rules::gqa;
use crate::rules::k_transpose::KInput;
use crate::rules::kv_cache::{self, FoundJoins, Joins, ShapeReader, Takeover};

/// `model` with its `Attention` nodes given their cache joins, or `None` when no node takes
/// any; notes in `report`.
pub fn give_caches(model: &ModelProto, report: &mut FusionReport) -> Result<Option<ModelProto>> {
    let graph = model.graph.as_ref().context("the model has no graph")?;
    // Each node is found again by its output after earlier rewrites.
    let outputs: Vec<String> = graph
        .node
        .iter()
        .filter(|n| n.op_type == "Attention" && opset::is_default_domain(&n.domain))
        .filter(|n| !n.name.starts_with("attnrt/"))
        .filter_map(|n| n.output.first().cloned())
        .collect();
    let opset_version = opset::default_version(model).unwrap_or(1);
    let mut work = model.clone();
    let mut changed = false;
    for y in outputs {
        let graph = work.graph.as_ref().context("the model has no graph")?;
        let order = topo_order(graph).map_err(|e| anyhow::anyhow!("{e}"))?;
        let view = GraphView::new(graph, &order, opset_version);
        let Some(at) = graph.node.iter().position(|n| n.output.first() == Some(&y)) else {
            continue;
        };
        let label = node_label(&graph.node[at]);
        let plan = match plan(&view, at, &label) {
            None => continue,
            Some(Err(why)) => {
                report.notes.push(format!("{label}: {why}"));
                continue;
            }
            Some(Ok(joins)) => joins,
        };
        let cache = &plan.cache;
        let graph = work.graph.as_mut().context("the model has no graph")?;
        rewrite::give_cache(graph, at, plan.nodes, cache)?;
        validate_model(&work).with_context(|| format!("after giving {label} its cache"))?;
        report.notes.push(format!(
            "{label}: takes its cache joins '{}', '{}' (past inputs, present outputs)",
            cache.present_key, cache.present_value
        ));
        changed = true;
    }
    Ok(changed.then_some(work))
}

/// The cache joins the node `at` takes over (with the `Shape` readers to recompute): `None`
/// without joins (or with a past already), `Err(why)` when it keeps them.
fn plan(view: &GraphView, at: usize, label: &str) -> Option<Result<FoundJoins, String>> {
    let n = view.node(at);
    let given = |i: usize, list: &[String]| list.get(i).is_some_and(|t| !t.is_empty());
    if given(4, &n.input) || given(5, &n.input) || given(1, &n.output) || given(2, &n.output) {
        return None;
    }
    if given(6, &n.input) {
        // (opset 24's `nonpad_kv_seqlen`, which describes the keys as the node reads them)
        return Some(Err("cache-concat kept (nonpad_kv_seqlen given)".into()));
    }
    let (q, k, v) = (n.input.first()?, n.input.get(1)?, n.input.get(2)?);
    let k_read = KInput {
        source: k.clone(),
        perm: None,
    };
    let repeat = gqa::before_repeat(view, &k_read, v);
    let (k_in, v_in) = match &repeat {
        Some(r) => (r.k.clone(), r.v.clone()),
        None => (k_read, v.clone()),
    };
    let mut joins = match kv_cache::joins(view, &k_in, &v_in) {
        Joins::Absent => return None,
        Joins::Kept(why) => return Some(Err(why.tag())),
        Joins::Found(j) => j,
    };
    Some(
        check(view, n, q, repeat.is_some(), &joins, label).map(|shape_readers| {
            joins.cache.shape_readers = shape_readers;
            joins
        }),
    )
}

/// The conditions of the module's doc on the node `n` reading Q `q` and the `joins`.
fn check(
    view: &GraphView,
    n: &attnrt_onnx::NodeProto,
    q: &str,
    repeated: bool,
    joins: &FoundJoins,
    label: &str,
) -> Result<Vec<ShapeReader>, String> {
    let kept = |why: &str| Err(format!("cache-concat kept ({why})"));
    if attr::int(n, "is_causal").ok().flatten().unwrap_or(0) != 0 {
        return kept("is_causal with a past is aligned bottom-right: not rewritten");
    }
    let c = &joins.cache;
    let (Some(qs), Some(ks)) = (view.shape(q), view.shape(&c.present_key)) else {
        return kept("shapes of Q or K unknown");
    };
    if qs.len() != 4 {
        return kept("Q is not 4-D");
    }
    if repeated {
        let heads = (qs[1].as_known(), ks[1].as_known());
        if !matches!(heads, (Some(a), Some(b)) if b > 0 && a % b == 0) {
            return kept("query heads not a known multiple of the cache's heads");
        }
    }
    let mut inputs = vec![q, c.new_key.as_str(), c.new_value.as_str()];
    inputs.extend(n.input.get(3).filter(|m| !m.is_empty()).map(String::as_str));
    match kv_cache::takeover(view, c, inputs, label) {
        Takeover::Kept(why) => Err(why.tag()),
        Takeover::Producible { shape_readers } => Ok(shape_readers),
    }
}
