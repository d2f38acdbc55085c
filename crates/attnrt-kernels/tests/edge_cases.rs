//! Hand-written cases: fully-masked rows, empty dimensions, shape errors, ISA selection.

use attnrt_kernels::{
    attention, reference, scratch_bytes, AttentionParams, Isa, KernelError, KernelSet, Mask, View4,
    ViewMut4,
};

/// The kernels of this process (the best ISA, unless `ATTNRT_KERNEL_ISA` says otherwise).
fn kernels() -> KernelSet {
    KernelSet::resolve().unwrap()
}

fn ramp(n: usize, c: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32) * 0.61 + c).sin()).collect()
}

/// Runs reference and every ISA on a dense problem; returns the outputs (reference first).
fn run_all(dims: [usize; 6], mask: &Mask, params: &AttentionParams) -> Vec<(String, Vec<f32>)> {
    let [b, hq, hkv, lq, lk, d] = dims;
    let qd = ramp(b * hq * lq * d, 0.1);
    let kd = ramp(b * hkv * lk * d, 0.2);
    let vd = ramp(b * hkv * lk * d, 0.3);
    let q = View4::contiguous(&qd, [b, hq, lq, d]).unwrap();
    let k = View4::contiguous(&kd, [b, hkv, lk, d]).unwrap();
    let v = View4::contiguous(&vd, [b, hkv, lk, d]).unwrap();
    let n = b * hq * lq * d;
    let mut results = Vec::new();
    let mut want = vec![f32::NAN; n];
    reference::attention(
        &q,
        &k,
        &v,
        mask,
        params,
        &mut ViewMut4::contiguous(&mut want, [b, hq, lq, d]).unwrap(),
    )
    .unwrap();
    results.push(("reference".to_string(), want));
    for isa in Isa::available() {
        let mut got = vec![f32::NAN; n];
        attention(
            &KernelSet::for_isa(isa).unwrap(),
            &q,
            &k,
            &v,
            mask,
            params,
            &mut ViewMut4::contiguous(&mut got, [b, hq, lq, d]).unwrap(),
        )
        .unwrap();
        results.push((isa.to_string(), got));
    }
    results
}

/// Every ISA's output of [`run_all`] within `tol` (max abs) of the reference's (the first entry);
/// a NaN where the reference has none (or the reverse) is an infinite difference.
fn assert_match_reference(results: &[(String, Vec<f32>)], tol: f32, what: &str) {
    let want = &results[0].1;
    for (who, got) in &results[1..] {
        let worst = want
            .iter()
            .zip(got)
            .map(|(a, b)| match (a.is_nan(), b.is_nan()) {
                (true, true) => 0.0,
                (false, false) => (a - b).abs(),
                _ => f32::INFINITY,
            })
            .fold(0.0f32, f32::max);
        assert!(worst < tol, "{who}, {what}: max |Δ| {worst}");
    }
}

#[test]
fn all_false_bool_row_gives_zeros_not_nan() {
    // Query row 1 may attend nothing; the others are ordinary.
    let (lq, lk) = (3, 5);
    let mut m = vec![true; lq * lk];
    for j in 0..lk {
        m[lk + j] = false;
    }
    let mask = Mask::Boolean(View4::contiguous(&m, [1, 1, lq, lk]).unwrap());
    for (who, out) in run_all([1, 2, 2, lq, lk, 8], &mask, &AttentionParams::new(0.3)) {
        for h in 0..2 {
            let row = &out[(h * lq + 1) * 8..(h * lq + 2) * 8];
            assert!(
                row.iter().all(|x| *x == 0.0),
                "{who}: fully-masked row {row:?}"
            );
            let other = &out[(h * lq) * 8..(h * lq + 1) * 8];
            assert!(
                other.iter().all(|x| x.is_finite() && *x != 0.0),
                "{who}: normal row {other:?}"
            );
        }
    }
}

#[test]
fn neg_inf_additive_row_gives_zeros() {
    let (lq, lk) = (4, 7);
    let mut m = ramp(lq * lk, 0.5);
    for j in 0..lk {
        m[2 * lk + j] = f32::NEG_INFINITY;
    }
    let mask = Mask::Additive(View4::contiguous(&m, [1, 1, lq, lk]).unwrap());
    let params = AttentionParams {
        scale: 0.5,
        causal: None,
        softcap: Some(1.0),
    };
    for (who, out) in run_all([2, 1, 1, lq, lk, 3], &mask, &params) {
        for b in 0..2 {
            let row = &out[(b * lq + 2) * 3..(b * lq + 3) * 3];
            assert_eq!(row, &[0.0; 3], "{who}");
        }
        assert!(out.iter().all(|x| x.is_finite()), "{who}: {out:?}");
    }
}

#[test]
fn min_filled_row_averages_v_over_every_key() {
    // transformers' fill absorbs the scores in float32: a row whose every key carries it gets
    // equal weights (the graph's mean of V), not the errata's zeros (which are for −inf).
    let (lq, lk, d) = (3, 5, 4);
    let mut m = ramp(lq * lk, 0.5);
    m[lk..2 * lk].fill(f32::MIN);
    let mask = Mask::Additive(View4::contiguous(&m, [1, 1, lq, lk]).unwrap());
    let vd = ramp(lk * d, 0.3);
    let mean: Vec<f32> = (0..d)
        .map(|e| (0..lk).map(|j| vd[j * d + e]).sum::<f32>() / lk as f32)
        .collect();
    for (who, out) in run_all([1, 1, 1, lq, lk, d], &mask, &AttentionParams::new(0.5)) {
        for e in 0..d {
            assert!(
                (out[d + e] - mean[e]).abs() < 1e-6,
                "{who}: {:?} vs {mean:?}",
                &out[d..2 * d]
            );
        }
    }
}

/// A left-padded batch's prompt with the causal rule in the mask (what the fusion keeps when the
/// triangle's fill is finite): key `j` is filled for query `i` when `j > i` or `j < pad`. The
/// kernel skips the key blocks after each block's last visible key and still gives the padded
/// rows (which see no key) the graph's mean over every key, across several query and key blocks.
#[test]
fn causal_padding_mask_with_a_finite_fill_matches_the_reference() {
    let (b, l) = (2, 300);
    let pads = [0usize, 130];
    for fill in [f32::MIN, f32::NEG_INFINITY] {
        let mut m = vec![0f32; b * l * l];
        for (bi, &pad) in pads.iter().enumerate() {
            for i in 0..l {
                for j in 0..l {
                    if j > i || j < pad {
                        m[(bi * l + i) * l + j] = fill;
                    }
                }
            }
        }
        let mask = Mask::Additive(View4::contiguous(&m, [b, 1, l, l]).unwrap());
        let results = run_all([b, 2, 2, l, l, 16], &mask, &AttentionParams::new(0.25));
        assert_match_reference(
            &results,
            1e-5,
            &format!("causal + left padding, fill {fill}"),
        );
    }
}

#[test]
fn causal_offset_excluding_every_key_gives_zeros() {
    // offset −2: queries 0 and 1 see no key (j <= i − 2), query 2 sees key 0.
    let params = AttentionParams {
        scale: 1.0,
        causal: Some(-2),
        softcap: None,
    };
    let d = 4;
    for (who, out) in run_all([1, 1, 1, 3, 3, d], &Mask::None, &params) {
        assert_eq!(&out[..2 * d], &[0.0; 8], "{who}");
        let v0 = &ramp(3 * d, 0.3)[..d];
        for e in 0..d {
            assert!(
                (out[2 * d + e] - v0[e]).abs() < 1e-6,
                "{who}: query 2 must equal V[0]"
            );
        }
    }
}

#[test]
fn causal_bottom_right_with_past() {
    // Lq = 2 new queries after 3 cached keys (offset 3): query 0 sees keys 0..=3, query 1 all 5.
    let params = AttentionParams {
        scale: 0.5,
        causal: Some(3),
        softcap: None,
    };
    let outs = run_all([1, 1, 1, 2, 5, 6], &Mask::None, &params);
    let no_causal = run_all([1, 1, 1, 2, 5, 6], &Mask::None, &AttentionParams::new(0.5));
    // The last query sees every key: same as without the causal rule.
    for ((who, out), (_, plain)) in outs.iter().zip(&no_causal) {
        for e in 0..6 {
            assert!((out[6 + e] - plain[6 + e]).abs() < 1e-5, "{who}");
        }
        assert!(
            (0..6).any(|e| (out[e] - plain[e]).abs() > 1e-4),
            "{who}: first query must differ"
        );
    }
}

#[test]
fn no_keys_gives_zero_rows() {
    for (who, out) in run_all([1, 2, 1, 3, 0, 4], &Mask::None, &AttentionParams::new(1.0)) {
        assert!(out.iter().all(|x| *x == 0.0), "{who}: {out:?}");
    }
    // A mask with zero keys on a non-empty K also masks everything.
    let m: Vec<bool> = vec![];
    let mask = Mask::Boolean(View4::contiguous(&m, [1, 1, 1, 0]).unwrap());
    for (who, out) in run_all([1, 1, 1, 2, 3, 4], &mask, &AttentionParams::new(1.0)) {
        assert!(out.iter().all(|x| *x == 0.0), "{who}: {out:?}");
    }
}

#[test]
fn empty_dimensions_are_fine() {
    for dims in [
        [0, 2, 1, 3, 3, 4],
        [1, 0, 0, 3, 3, 4],
        [1, 2, 2, 0, 3, 4],
        [1, 2, 2, 3, 3, 0],
    ] {
        let outs = run_all(dims, &Mask::None, &AttentionParams::new(1.0));
        assert!(outs.iter().all(|(_, o)| o.iter().all(|x| x.is_finite())));
    }
}

fn shape_error(
    q: [usize; 4],
    k: [usize; 4],
    v: [usize; 4],
    out: [usize; 4],
    mask: Option<[usize; 4]>,
) -> String {
    let buf = vec![0.0f32; 4096];
    let qv = View4::contiguous(&buf[..q.iter().product()], q).unwrap();
    let kv = View4::contiguous(&buf[..k.iter().product()], k).unwrap();
    let vv = View4::contiguous(&buf[..v.iter().product()], v).unwrap();
    let mbuf = vec![0.0f32; 4096];
    let mask = match mask {
        Some(md) => Mask::Additive(View4::contiguous(&mbuf[..md.iter().product()], md).unwrap()),
        None => Mask::None,
    };
    let mut obuf = vec![0.0f32; out.iter().product()];
    let mut ov = ViewMut4::contiguous(&mut obuf, out).unwrap();
    let params = AttentionParams::new(1.0);
    let err = attention(&kernels(), &qv, &kv, &vv, &mask, &params, &mut ov).unwrap_err();
    let r = reference::attention(&qv, &kv, &vv, &mask, &AttentionParams::new(1.0), &mut ov)
        .unwrap_err();
    assert_eq!(err.to_string(), r.to_string());
    assert!(matches!(err, KernelError::Shape(_)), "{err}");
    err.to_string()
}

#[test]
fn shape_errors_name_the_problem() {
    let e = shape_error([1, 3, 4, 8], [1, 2, 5, 8], [1, 2, 5, 8], [1, 3, 4, 8], None);
    assert!(e.contains("multiple"), "{e}");
    let e = shape_error([1, 2, 4, 8], [1, 2, 5, 7], [1, 2, 5, 8], [1, 2, 4, 8], None);
    assert!(e.contains("head size"), "{e}");
    let e = shape_error([1, 2, 4, 8], [1, 2, 5, 8], [1, 2, 6, 8], [1, 2, 4, 8], None);
    assert!(e.contains("V dims"), "{e}");
    let e = shape_error([1, 2, 4, 8], [1, 2, 5, 8], [1, 2, 5, 8], [1, 2, 4, 9], None);
    assert!(e.contains("out dims"), "{e}");
    let e = shape_error(
        [2, 2, 4, 8],
        [2, 2, 5, 8],
        [2, 2, 5, 8],
        [2, 2, 4, 8],
        Some([1, 2, 3, 5]),
    );
    assert!(e.contains("query length"), "{e}");
    let e = shape_error(
        [1, 2, 4, 8],
        [1, 2, 5, 8],
        [1, 2, 5, 8],
        [1, 2, 4, 8],
        Some([1, 1, 4, 6]),
    );
    assert!(e.contains("6 keys"), "{e}");
    let e = shape_error([1, 2, 4, 8], [2, 2, 5, 8], [2, 2, 5, 8], [1, 2, 4, 8], None);
    assert!(e.contains("batch"), "{e}");
}

#[test]
fn views_built_by_hand_are_validated_at_the_boundary() {
    let buf = vec![0.0f32; 16];
    let short = View4 {
        data: &buf[..10],
        dims: [1, 1, 4, 4],
        strides: [16, 16, 4, 1],
    };
    let ok = View4::contiguous(&buf, [1, 1, 4, 4]).unwrap();
    let mut obuf = vec![0.0f32; 16];
    let mut out = ViewMut4::contiguous(&mut obuf, [1, 1, 4, 4]).unwrap();
    let err = attention(
        &kernels(),
        &short,
        &ok,
        &ok,
        &Mask::None,
        &AttentionParams::new(1.0),
        &mut out,
    )
    .unwrap_err();
    assert!(
        matches!(err, KernelError::InvalidView { tensor: "Q", .. }),
        "{err}"
    );
    // An output whose rows alias each other would be written concurrently: rejected.
    let mut obuf = vec![0.0f32; 16];
    let mut aliased = ViewMut4 {
        data: &mut obuf,
        dims: [1, 1, 4, 4],
        strides: [0, 0, 0, 1],
    };
    let err = attention(
        &kernels(),
        &ok,
        &ok,
        &ok,
        &Mask::None,
        &AttentionParams::new(1.0),
        &mut aliased,
    )
    .unwrap_err();
    assert!(
        matches!(err, KernelError::InvalidView { tensor: "out", .. }),
        "{err}"
    );
}

#[test]
fn isa_names_and_availability() {
    assert_eq!(Isa::parse("AVX512"), Some(Isa::Avx512));
    assert_eq!(Isa::parse("avx2"), Some(Isa::Avx2));
    assert_eq!(Isa::parse("scalar"), Some(Isa::Scalar));
    assert_eq!(Isa::parse("sse9"), None);
    assert!(Isa::Scalar.is_available());
    assert_eq!(Isa::available()[0], Isa::best_available());
    for isa in Isa::ALL {
        match KernelSet::for_isa(isa) {
            Ok(set) => assert!(isa.is_available() && set.isa() == isa),
            Err(err) => assert!(
                !isa.is_available() && matches!(err, KernelError::IsaUnavailable { .. }),
                "{isa}: {err}"
            ),
        }
    }
}

#[test]
fn scratch_is_independent_of_sequence_length() {
    // One per pool thread, whatever L; the budget is "well under 100 MB" at L = 8192.
    for isa in Isa::available() {
        let bytes = scratch_bytes(KernelSet::for_isa(isa).unwrap().flash(), 128, 128);
        assert!(bytes < 1024 * 1024, "{isa}: {bytes} bytes");
    }
}

/// One thread and one kv-head: the kernel packs up to 16 query blocks into one task (sharing
/// every K/V block among them); each block has its own causal frontier and mask rows.
#[test]
fn long_tasks_with_many_query_blocks_match_the_reference() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    // [B, Hq, Hkv, Lq, Lk, D]: Lq·Lk varied so tasks get 2..16 query blocks, the last one partial.
    for dims in [
        [1, 2, 1, 1100, 1100, 32],
        [1, 1, 1, 2500, 700, 16],
        [2, 2, 1, 700, 1300, 8],
    ] {
        let [b, hq, _, lq, lk, _] = dims;
        let mvals = ramp(b * lq * lk, 0.7);
        let add = Mask::Additive(View4::contiguous(&mvals, [b, 1, lq, lk]).unwrap());
        let bools: Vec<bool> = (0..lq * lk).map(|i| (i * 7919) % 5 != 0).collect();
        let boolean = Mask::Boolean(View4::contiguous(&bools, [1, 1, lq, lk]).unwrap());
        for (mask, causal) in [
            (&Mask::None, Some(0)),
            (&add, Some(lk as isize - lq as isize)),
            (&boolean, None),
            (&add, None),
        ] {
            let params = AttentionParams {
                scale: 0.2,
                causal,
                softcap: None,
            };
            let results = pool.install(|| run_all(dims, mask, &params));
            assert_match_reference(
                &results,
                2e-5,
                &format!("dims {dims:?} causal {causal:?} hq {hq}"),
            );
        }
    }
}

/// Masks stored as `[B, 1, Lq, Lk]` whose query rows are all equal within each batch (a row mask
/// widened, as exports and attnrt's fusion pass them) are read as row masks; masks that differ in
/// a single element of one late row (last batch, last query, last key; or -0.0 against 0.0) must
/// not be. Every variant against the reference, additive and boolean, with the key axis
/// contiguous and with stride 2.
#[test]
fn masks_with_equal_query_rows_and_near_misses_match_the_reference() {
    let (b, h, lq, lk, d) = (2, 3, 70, 45, 16);
    let row = |bb: usize, j: usize| ((bb * 31 + j * 7) % 11) as f32 - 5.0;
    let widened: Vec<f32> = (0..b * lq * lk)
        .map(|i| row(i / (lq * lk), i % lk))
        .collect();
    let last = b * lq * lk - 1;
    let mut late = widened.clone();
    late[last] += 3.0;
    let mut signed_zero = vec![0.0f32; b * lq * lk];
    signed_zero[(lq - 1) * lk + 3] = -0.0;
    // Every other float: the key axis with stride 2.
    let spread: Vec<f32> = late.iter().flat_map(|&x| [x, f32::NAN]).collect();
    let bools: Vec<bool> = (0..b * lq * lk)
        .map(|i| (i % lk) % 4 != (i / (lq * lk)))
        .collect();
    let mut bools_late = bools.clone();
    bools_late[last] = !bools_late[last];
    let dims = [b, 1, lq, lk];
    let strided = [(lq * lk * 2) as isize, 0, (lk * 2) as isize, 2];
    let masks = [
        (
            "widened",
            Mask::Additive(View4::contiguous(&widened, dims).unwrap()),
        ),
        (
            "late row differs",
            Mask::Additive(View4::contiguous(&late, dims).unwrap()),
        ),
        (
            "-0.0 in one row",
            Mask::Additive(View4::contiguous(&signed_zero, dims).unwrap()),
        ),
        (
            "strided keys, late row differs",
            Mask::Additive(View4::new(&spread, dims, strided).unwrap()),
        ),
        (
            "bool widened",
            Mask::Boolean(View4::contiguous(&bools, dims).unwrap()),
        ),
        (
            "bool late row differs",
            Mask::Boolean(View4::contiguous(&bools_late, dims).unwrap()),
        ),
    ];
    for (name, mask) in &masks {
        let results = run_all([b, h, h, lq, lk, d], mask, &AttentionParams::new(0.25));
        assert_match_reference(&results, 1e-5, &format!("mask {name}"));
    }
}

/// Every tensor with a head-dim stride of 2 (every other float): the kernel's strided paths
/// (gathered Qᵀ packing, element-wise K/V packing and output scatter) against the reference.
#[test]
fn strided_head_dimension_matches_the_reference() {
    let (b, h, lq, lk, d) = (1, 2, 70, 50, 24);
    let dims_q = [b, h, lq, d];
    let dims_k = [b, h, lk, d];
    let strides = |l: usize| {
        [
            (h * l * d * 2) as isize,
            (l * d * 2) as isize,
            (d * 2) as isize,
            2,
        ]
    };
    let qd = ramp(b * h * lq * d * 2, 0.1);
    let kd = ramp(b * h * lk * d * 2, 0.2);
    let vd = ramp(b * h * lk * d * 2, 0.3);
    let q = View4::new(&qd, dims_q, strides(lq)).unwrap();
    let k = View4::new(&kd, dims_k, strides(lk)).unwrap();
    let v = View4::new(&vd, dims_k, strides(lk)).unwrap();
    let params = AttentionParams {
        scale: 0.3,
        causal: Some(-3),
        softcap: None,
    };
    let mut want = vec![0.0f32; b * h * lq * d * 2];
    reference::attention(
        &q,
        &k,
        &v,
        &Mask::None,
        &params,
        &mut ViewMut4::new(&mut want, dims_q, strides(lq)).unwrap(),
    )
    .unwrap();
    for isa in Isa::available() {
        let mut got = vec![0.0f32; b * h * lq * d * 2];
        attention(
            &KernelSet::for_isa(isa).unwrap(),
            &q,
            &k,
            &v,
            &Mask::None,
            &params,
            &mut ViewMut4::new(&mut got, dims_q, strides(lq)).unwrap(),
        )
        .unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() < 2e-5,
                "{isa}: element {i}: {g} vs reference {w}"
            );
        }
    }
}
