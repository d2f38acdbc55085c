//! `attention_appending`: present = past ++ current built by the call, Y equal to the reference
//! over that concatenation, on every ISA, on the decode path and the flash fallback.

use attnrt_kernels::{
    attention_appending, reference, AttentionParams, CacheAppend, Isa, KernelSet, Mask, View4,
    ViewMut4,
};

fn ramp(n: usize, c: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32) * 0.37 + c).sin()).collect()
}

/// One appending call's sizes and options.
#[derive(Clone, Copy)]
struct Case {
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    past: usize,
    new: usize,
    d: usize,
    dv: usize,
    causal: bool,
    /// Keys the mask covers (`None`: no mask); fewer than `past + new` leaves keys unvisited.
    mask_keys: Option<usize>,
    /// The past stored `[B, H, D, P]` and seen through transposed strides.
    strided_past: bool,
}

impl Case {
    fn decode(past: usize) -> Case {
        Case {
            batch: 2,
            q_heads: 8,
            kv_heads: 2,
            past,
            new: 1,
            d: 64,
            dv: 64,
            causal: true,
            mask_keys: None,
            strided_past: false,
        }
    }
}

/// The past as a view: dense `[B, H, P, D]`, or stored `[B, H, D, P]` with swapped strides.
fn past_view(data: &[f32], c: &Case, d: usize) -> View4<'static> {
    let data: &'static [f32] = Box::leak(data.to_vec().into_boxed_slice());
    let dims = [c.batch, c.kv_heads, c.past, d];
    if !c.strided_past {
        return View4::contiguous(data, dims).unwrap();
    }
    let hs = (c.past * d) as isize;
    let strides = [c.kv_heads as isize * hs, hs, 1, c.past as isize];
    View4::new(data, dims, strides).unwrap()
}

/// `present` = past ++ current, dense, built element by element.
fn concat(past: &View4, cur: &[f32], c: &Case, d: usize) -> Vec<f32> {
    let total = c.past + c.new;
    let mut out = Vec::with_capacity(c.batch * c.kv_heads * total * d);
    for b in 0..c.batch {
        for h in 0..c.kv_heads {
            for j in 0..total {
                for e in 0..d {
                    out.push(if j < c.past {
                        let st = past.strides;
                        past.data[(b as isize * st[0]
                            + h as isize * st[1]
                            + j as isize * st[2]
                            + e as isize * st[3]) as usize]
                    } else {
                        cur[((b * c.kv_heads + h) * c.new + j - c.past) * d + e]
                    });
                }
            }
        }
    }
    out
}

/// `present` with only the current rows written (the past rows hold NaN until the call).
fn present_with_current(cur: &[f32], c: &Case, d: usize) -> Vec<f32> {
    let total = c.past + c.new;
    let mut out = vec![f32::NAN; c.batch * c.kv_heads * total * d];
    for (bh, slice) in out.chunks_mut(total * d).enumerate() {
        slice[c.past * d..].copy_from_slice(&cur[bh * c.new * d..(bh + 1) * c.new * d]);
    }
    out
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            if x.is_nan() || y.is_nan() {
                f32::INFINITY
            } else {
                (x - y).abs()
            }
        })
        .fold(0.0, f32::max)
}

/// Runs the case on every ISA and checks present (exactly) and Y (within 2e-5) against the
/// reference over the concatenation.
fn check(c: Case) {
    let total = c.past + c.new;
    let what = format!(
        "B{} Hq{} Hkv{} P{} L{} D{}/{} causal {} mask {:?} strided {}",
        c.batch,
        c.q_heads,
        c.kv_heads,
        c.past,
        c.new,
        c.d,
        c.dv,
        c.causal,
        c.mask_keys,
        c.strided_past
    );
    let qd = ramp(c.batch * c.q_heads * c.new * c.d, 0.1);
    let q = View4::contiguous(&qd, [c.batch, c.q_heads, c.new, c.d]).unwrap();
    let pk = past_view(&ramp(c.batch * c.kv_heads * c.past * c.d, 0.2), &c, c.d);
    let pv = past_view(&ramp(c.batch * c.kv_heads * c.past * c.dv, 0.3), &c, c.dv);
    let ck = ramp(c.batch * c.kv_heads * c.new * c.d, 0.4);
    let cv = ramp(c.batch * c.kv_heads * c.new * c.dv, 0.5);
    let (want_k, want_v) = (concat(&pk, &ck, &c, c.d), concat(&pv, &cv, &c, c.dv));
    let mask_data: Vec<f32> = (0..c.mask_keys.unwrap_or(0))
        .map(|j| {
            if j % 5 == 3 {
                f32::NEG_INFINITY
            } else {
                (j as f32 * 0.01).cos()
            }
        })
        .collect();
    let mask = match c.mask_keys {
        None => Mask::None,
        Some(n) => Mask::Additive(View4::new(&mask_data, [1, 1, 1, n], [0, 0, 0, 1]).unwrap()),
    };
    let params = AttentionParams {
        causal: c.causal.then_some(c.past as isize),
        ..AttentionParams::new(0.125)
    };
    let out_dims = [c.batch, c.q_heads, c.new, c.dv];
    let mut want = vec![f32::NAN; out_dims.iter().product()];
    reference::attention(
        &q,
        &View4::contiguous(&want_k, [c.batch, c.kv_heads, total, c.d]).unwrap(),
        &View4::contiguous(&want_v, [c.batch, c.kv_heads, total, c.dv]).unwrap(),
        &mask,
        &params,
        &mut ViewMut4::contiguous(&mut want, out_dims).unwrap(),
    )
    .unwrap();
    for isa in Isa::available() {
        let mut present_k = present_with_current(&ck, &c, c.d);
        let mut present_v = present_with_current(&cv, &c, c.dv);
        let mut got = vec![f32::NAN; want.len()];
        let cache = CacheAppend {
            past_key: &pk,
            past_value: &pv,
            present_key: &mut present_k,
            present_value: &mut present_v,
            total,
        };
        let mut out = ViewMut4::contiguous(&mut got, out_dims).unwrap();
        let kernels = KernelSet::for_isa(isa).unwrap();
        attention_appending(&kernels, &q, cache, &mask, &params, &mut out).unwrap();
        assert_eq!(present_k, want_k, "{isa}: present_key, {what}");
        assert_eq!(present_v, want_v, "{isa}: present_value, {what}");
        let err = max_abs(&got, &want);
        assert!(err <= 2e-5, "{isa}: Y off by {err}, {what}");
    }
}

#[test]
fn decode_step_builds_present_and_matches_reference() {
    // Several key splits per head (past ≫ the minimum split) and a single short one.
    for past in [0, 1, 37, 700, 2100] {
        check(Case::decode(past));
    }
}

#[test]
fn grouped_heads_value_width_and_strided_past() {
    check(Case {
        q_heads: 6,
        kv_heads: 3,
        d: 24,
        dv: 40,
        new: 3,
        strided_past: true,
        ..Case::decode(555)
    });
    check(Case {
        batch: 1,
        q_heads: 4,
        kv_heads: 4,
        causal: false,
        ..Case::decode(300)
    });
}

#[test]
fn keys_past_the_mask_are_still_copied() {
    // The mask covers fewer keys than the past holds: no task reads the rest, yet present gets
    // every row.
    check(Case {
        mask_keys: Some(400),
        causal: false,
        ..Case::decode(900)
    });
    check(Case {
        mask_keys: Some(901),
        ..Case::decode(900)
    });
}

#[test]
fn many_queries_take_the_flash_path() {
    check(Case {
        new: 9,
        ..Case::decode(260)
    });
}

#[test]
fn no_queries_still_build_present() {
    check(Case {
        new: 0,
        causal: false,
        ..Case::decode(50)
    });
}

#[test]
fn present_of_the_wrong_size_is_an_error() {
    let c = Case::decode(4);
    let pk_data = ramp(c.batch * c.kv_heads * c.past * c.d, 0.2);
    let pk = View4::contiguous(&pk_data, [c.batch, c.kv_heads, c.past, c.d]).unwrap();
    let qd = ramp(c.batch * c.q_heads * c.d, 0.1);
    let q = View4::contiguous(&qd, [c.batch, c.q_heads, 1, c.d]).unwrap();
    let mut present_k = vec![0.0; c.batch * c.kv_heads * 5 * c.d];
    let mut present_v = vec![0.0; c.batch * c.kv_heads * 4 * c.d];
    let mut y = vec![0.0; c.batch * c.q_heads * c.d];
    let cache = CacheAppend {
        past_key: &pk,
        past_value: &pk,
        present_key: &mut present_k,
        present_value: &mut present_v,
        total: 5,
    };
    let mut out = ViewMut4::contiguous(&mut y, [c.batch, c.q_heads, 1, c.d]).unwrap();
    let err = attention_appending(
        &KernelSet::for_isa(Isa::Scalar).unwrap(),
        &q,
        cache,
        &Mask::None,
        &AttentionParams::new(0.1),
        &mut out,
    )
    .unwrap_err();
    assert!(err.to_string().contains("present_value"), "{err}");
}
