//! Property test: the kernel on every ISA path this CPU has and on every route (flash, decode,
//! and the automatic choice) equals the f64 reference over
//! random shapes (GQA, Lq ≠ Lk, odd head sizes), layouts (dense 4-D, 3-D `[B, L, H·D]`, padded
//! rows), masks (none / additive / bool, broadcast on any of batch, head, query, key axis, keys
//! shorter than Lk, masked entries and random fully masked rows — masked by `−inf` or by
//! transformers' `finfo(float32).min` fill (the row then averages V, as in the float32 graph);
//! BERT's old `−10000` on some keys), causal offsets, soft-cap and scale.
//!
//! Tolerance: |kernel − reference| ≤ 3e-5 + 3e-4·|reference| per element (f32 accumulation and
//! the ≈1-ulp polynomial exp against f64), and exact zeros where the reference row is fully
//! masked. The output buffer starts as NaN, so an element the kernel forgets to write fails.
//! proptest's default 256 cases (this crate is built at opt-level 3 in the dev profile; a few
//! seconds); set PROPTEST_CASES for more.

use attnrt_kernels::{
    attention, reference, AttentionParams, Isa, KernelSet, Mask, Route, View4, ViewMut4,
};
use proptest::prelude::*;

/// Small deterministic generator for tensor contents (proptest shrinks the seed, not the data).
struct SplitMix(u64);
impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Dense `[B, H, L, D]`.
    Bhld,
    /// Dense `[B, L, H·D]` (ONNX 3-D input) seen as 4-D.
    Bshd,
    /// `[B, H, L, D]` with 3 unused floats after each row.
    Padded,
}

#[derive(Clone, Copy, Debug)]
enum KeyAxis {
    Full,
    /// One value per (b, h, i) broadcast over keys with stride 0.
    Broadcast,
    /// ONNX-style short mask: keys at and beyond `len` are masked.
    Short(usize),
}

#[derive(Clone, Debug)]
enum MaskCase {
    None,
    Additive {
        bcast: [bool; 3],
        keys: KeyAxis,
        /// The value of a masked entry: `−inf`, `f32::MIN` or `−10000`.
        fill: f32,
        p_masked: f32,
        masked_rows: bool,
    },
    Boolean {
        bcast: [bool; 3],
        keys: KeyAxis,
        p_false: f32,
        false_rows: bool,
    },
}

#[derive(Clone, Debug)]
struct Case {
    b: usize,
    hkv: usize,
    ratio: usize,
    lq: usize,
    lk: usize,
    d: usize,
    dv: usize,
    layouts: [Layout; 4],
    mask: MaskCase,
    causal: Option<isize>,
    softcap: Option<f32>,
    scale: f32,
    amplitude: f32,
    seed: u64,
}

/// A tensor buffer plus strides for the given layout of dims `[b, h, l, d]`.
fn layout_tensor(
    rng: &mut SplitMix,
    layout: Layout,
    dims: [usize; 4],
    amp: f32,
) -> (Vec<f32>, [isize; 4]) {
    let [b, h, l, d] = dims;
    let (len, strides) = match layout {
        Layout::Bhld => (
            b * h * l * d,
            [(h * l * d) as isize, (l * d) as isize, d as isize, 1],
        ),
        Layout::Bshd => (
            b * l * h * d,
            [(l * h * d) as isize, d as isize, (h * d) as isize, 1],
        ),
        Layout::Padded => {
            let row = d + 3;
            (
                b * h * l * row,
                [(h * l * row) as isize, (l * row) as isize, row as isize, 1],
            )
        }
    };
    ((0..len).map(|_| rng.unit() * amp).collect(), strides)
}

fn mask_dims(bcast: [bool; 3], keys: KeyAxis, full: [usize; 4]) -> ([usize; 4], [usize; 4]) {
    // (view dims, stored dims); stored key extent is 1 for a stride-0 key broadcast.
    let mut dims = full;
    for a in 0..3 {
        if bcast[a] {
            dims[a] = 1;
        }
    }
    let mut stored = dims;
    match keys {
        KeyAxis::Full => {}
        KeyAxis::Broadcast => stored[3] = 1,
        KeyAxis::Short(n) => {
            dims[3] = n;
            stored[3] = n;
        }
    }
    (dims, stored)
}

fn strides_for(stored: [usize; 4], keys: KeyAxis) -> [isize; 4] {
    let s3 = if matches!(keys, KeyAxis::Broadcast) {
        0
    } else {
        1
    };
    [
        (stored[1] * stored[2] * stored[3]) as isize,
        (stored[2] * stored[3]) as isize,
        stored[3] as isize,
        s3,
    ]
}

/// Every ISA on every route, and the flash kernel without skipping masked key blocks too.
fn every_kernel_set() -> Vec<KernelSet> {
    let choices = [
        (Route::Auto, true),
        (Route::Flash, true),
        (Route::Decode, true),
        (Route::Flash, false),
    ];
    let sets = Isa::available()
        .into_iter()
        .map(|isa| KernelSet::for_isa(isa).unwrap());
    sets.flat_map(|set| choices.map(|(r, ends)| set.with_route(r).with_key_ends(ends)))
        .collect()
}

fn run_case(c: &Case) -> Result<(), TestCaseError> {
    let hq = c.hkv * c.ratio;
    let mut rng = SplitMix(c.seed);
    let (qd, qs) = layout_tensor(&mut rng, c.layouts[0], [c.b, hq, c.lq, c.d], c.amplitude);
    let (kd, ks) = layout_tensor(&mut rng, c.layouts[1], [c.b, c.hkv, c.lk, c.d], c.amplitude);
    let (vd, vs) = layout_tensor(&mut rng, c.layouts[2], [c.b, c.hkv, c.lk, c.dv], 1.0);
    let q = View4::new(&qd, [c.b, hq, c.lq, c.d], qs).unwrap();
    let k = View4::new(&kd, [c.b, c.hkv, c.lk, c.d], ks).unwrap();
    let v = View4::new(&vd, [c.b, c.hkv, c.lk, c.dv], vs).unwrap();
    let full = [c.b, hq, c.lq, c.lk];

    let fdata: Vec<f32>;
    let bdata: Vec<bool>;
    let mask = match &c.mask {
        MaskCase::None => Mask::None,
        MaskCase::Additive {
            bcast,
            keys,
            fill,
            p_masked,
            masked_rows,
        } => {
            let (dims, stored) = mask_dims(*bcast, *keys, full);
            let n: usize = stored.iter().product();
            let mut data: Vec<f32> = (0..n)
                .map(|_| {
                    let u = rng.unit();
                    if (u + 1.0) / 2.0 < *p_masked {
                        *fill
                    } else {
                        u * 2.0
                    }
                })
                .collect();
            if *masked_rows {
                mask_random_rows(&mut data, stored[3], &mut rng, *fill);
            }
            if ill_conditioned(*fill) {
                // A row that such a fill masks whole is ill-conditioned: in float32 the fill's
                // spacing (1e-3 at −10000) quantizes the scores, so any two float32
                // implementations (this kernel and the reference, tract and ONNX Runtime)
                // differ there by ~1e-3. Every row keeps its first key.
                for row in data.chunks_mut(stored[3].max(1)) {
                    row[0] = 0.5;
                }
            }
            fdata = data;
            Mask::Additive(View4::new(&fdata, dims, strides_for(stored, *keys)).unwrap())
        }
        MaskCase::Boolean {
            bcast,
            keys,
            p_false,
            false_rows,
        } => {
            let (dims, stored) = mask_dims(*bcast, *keys, full);
            let n: usize = stored.iter().product();
            let mut data: Vec<bool> = (0..n)
                .map(|_| (rng.unit() + 1.0) / 2.0 >= *p_false)
                .collect();
            if *false_rows {
                mask_random_rows(&mut data, stored[3], &mut rng, false);
            }
            bdata = data;
            Mask::Boolean(View4::new(&bdata, dims, strides_for(stored, *keys)).unwrap())
        }
    };
    let params = AttentionParams {
        scale: c.scale,
        causal: c.causal,
        softcap: c.softcap,
    };

    let out_dims = [c.b, hq, c.lq, c.dv];
    let (mut want_buf, ws) = layout_tensor(&mut rng, c.layouts[3], out_dims, 1.0);
    want_buf.iter_mut().for_each(|x| *x = f32::NAN);
    reference::attention(
        &q,
        &k,
        &v,
        &mask,
        &params,
        &mut ViewMut4::new(&mut want_buf, out_dims, ws).unwrap(),
    )
    .unwrap();
    let want_view = View4::new(&want_buf, out_dims, ws).unwrap();

    for kernels in every_kernel_set() {
        let mut got_buf = vec![f32::NAN; want_buf.len()];
        attention(
            &kernels,
            &q,
            &k,
            &v,
            &mask,
            &params,
            &mut ViewMut4::new(&mut got_buf, out_dims, ws).unwrap(),
        )
        .unwrap();
        let got_view = View4::new(&got_buf, out_dims, ws).unwrap();
        check_output(&kernels, &got_view, &want_view)?;
    }
    Ok(())
}

/// Every element of `got` (the output of `kernels`) against the reference's `want`, both in the
/// same layout: within 3e-5 + 3e-4·|w|, and exactly 0 where the reference row is fully masked
/// (only fully-masked rows give exact zeros with random V).
fn check_output(kernels: &KernelSet, got: &View4, want: &View4) -> Result<(), TestCaseError> {
    let who = format!(
        "{}/{} key_ends {}",
        kernels.isa(),
        kernels.decode().route().name(),
        kernels.flash().key_ends()
    );
    let [nb, nh, nq, ne] = want.dims;
    let s = want.strides;
    for b in 0..nb {
        for h in 0..nh {
            for i in 0..nq {
                for e in 0..ne {
                    let off = (b as isize * s[0]
                        + h as isize * s[1]
                        + i as isize * s[2]
                        + e as isize * s[3]) as usize;
                    let (w, g) = (want.data[off], got.data[off]);
                    prop_assert!(w.is_finite(), "reference produced {w} at [{b},{h},{i},{e}]");
                    if w == 0.0 {
                        prop_assert_eq!(
                            g,
                            0.0,
                            "{}: out[{},{},{},{}] of a fully-masked row",
                            who,
                            b,
                            h,
                            i,
                            e
                        );
                    }
                    prop_assert!(
                        (g - w).abs() <= 3e-5 + 3e-4 * w.abs(),
                        "{who}: out[{b},{h},{i},{e}] = {g}, reference {w}"
                    );
                }
            }
        }
    }
    Ok(())
}

fn layout() -> impl Strategy<Value = Layout> {
    prop_oneof![Just(Layout::Bhld), Just(Layout::Bshd), Just(Layout::Padded)]
}

fn head_dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(1usize),
        Just(3),
        Just(8),
        Just(17),
        Just(32),
        Just(64),
        Just(80),
        Just(96),
        Just(128)
    ]
}

fn key_axis(lk: usize) -> BoxedStrategy<KeyAxis> {
    if lk >= 2 {
        prop_oneof![3 => Just(KeyAxis::Full), 1 => Just(KeyAxis::Broadcast), 1 => (1..lk).prop_map(KeyAxis::Short)].boxed()
    } else {
        prop_oneof![Just(KeyAxis::Full), Just(KeyAxis::Broadcast)].boxed()
    }
}

fn mask_case(lk: usize) -> BoxedStrategy<MaskCase> {
    let bcast = prop::array::uniform3(any::<bool>());
    prop_oneof![
        1 => Just(MaskCase::None),
        3 => (bcast, key_axis(lk), fill(), prop_oneof![Just(0.0f32), Just(0.3)], any::<bool>())
            .prop_map(|(bcast, keys, fill, p_masked, masked_rows)| MaskCase::Additive { bcast, keys, fill, p_masked, masked_rows }),
        2 => (bcast, key_axis(lk), prop_oneof![Just(0.1f32), Just(0.6)], any::<bool>())
            .prop_map(|(bcast, keys, p_false, false_rows)| MaskCase::Boolean { bcast, keys, p_false, false_rows }),
    ]
    .boxed()
}

/// The value of a masked entry of an additive mask: `−inf`, transformers' `finfo(float32).min`
/// (which absorbs the score in float32), or BERT's old `−10000`.
fn fill() -> impl Strategy<Value = f32> {
    prop_oneof![Just(f32::NEG_INFINITY), Just(f32::MIN), Just(-10000.0f32)]
}

/// Whether a row masked whole by `fill` magnifies the scores' rounding (a finite fill that does
/// not absorb every score in float32, such as −10000).
fn ill_conditioned(fill: f32) -> bool {
    fill.is_finite() && fill > -1.0e30
}

/// Sets each stored mask row (runs of `row` entries) to `fill` with probability 0.3: query rows
/// that see no key, wherever the mask's broadcast puts them.
fn mask_random_rows<T: Copy>(data: &mut [T], row: usize, rng: &mut SplitMix, fill: T) {
    if row == 0 {
        return;
    }
    for r in data.chunks_mut(row) {
        if (rng.unit() + 1.0) / 2.0 < 0.3 {
            r.fill(fill);
        }
    }
}

fn case() -> impl Strategy<Value = Case> {
    (
        1usize..=2,
        1usize..=4,
        1usize..=4,
        1usize..=70,
        0usize..=70,
        head_dim(),
        prop::option::of(head_dim()),
    )
        .prop_flat_map(|(b, hkv, ratio, lq, lk, d, dv)| {
            (
                Just((b, hkv, ratio, lq, lk, d, dv.unwrap_or(d))),
                prop::array::uniform4(layout()),
                mask_case(lk),
                prop::option::of(-8isize..=40),
                prop::option::of(prop_oneof![Just(0.5f32), Just(2.0), Just(30.0), Just(0.0)]),
                prop_oneof![Just(None), Just(Some(0.05f32)), Just(Some(0.3))],
                prop_oneof![Just(0.5f32), Just(1.0), Just(2.0)],
                any::<u64>(),
            )
        })
        .prop_map(
            |(
                (b, hkv, ratio, lq, lk, d, dv),
                layouts,
                mask,
                causal,
                softcap,
                scale,
                amplitude,
                seed,
            )| Case {
                b,
                hkv,
                ratio,
                lq,
                lk,
                d,
                dv,
                layouts,
                mask,
                causal,
                softcap,
                scale: scale.unwrap_or(AttentionParams::default_scale(d)),
                amplitude,
                seed,
            },
        )
}

/// Decode shapes: 1–4 queries against 1–300 keys (up to two key splits), GQA groups up to 8.
fn decode_case() -> impl Strategy<Value = Case> {
    (
        case(),
        1usize..=4,
        1usize..=300,
        prop_oneof![Just(1usize), Just(2), Just(4), Just(8)],
    )
        .prop_flat_map(|(c, lq, lk, ratio)| {
            (
                Just(Case { lq, lk, ratio, ..c }),
                mask_case(lk),
                prop::option::of(-4isize..=300),
            )
        })
        .prop_map(|(c, mask, causal)| Case { mask, causal, ..c })
}

proptest! {
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn kernel_matches_reference(c in case()) {
        run_case(&c)?;
    }

    #[test]
    fn decode_shapes_match_reference(c in decode_case()) {
        run_case(&c)?;
    }
}

/// The decode path with many key splits (a pool of 8 threads asks for 32 tasks): causal
/// frontiers inside a split, splits every key of which is masked, whole rows masked, GQA 4.
#[test]
fn decode_splits_merge_like_reference() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(8)
        .build()
        .unwrap();
    for (i, (lq, lk, causal, p_neg_inf)) in [
        (1, 1500, None, 0.0),
        (1, 2100, Some(700), 0.0),
        (4, 1200, Some(1196), 0.5),
        (3, 1800, Some(-1), 0.99),
        (2, 900, Some(300), 0.0),
    ]
    .into_iter()
    .enumerate()
    {
        let c = Case {
            b: 2,
            hkv: 1,
            ratio: 4,
            lq,
            lk,
            d: 64,
            dv: 72,
            layouts: [Layout::Bshd, Layout::Bhld, Layout::Padded, Layout::Bshd],
            mask: if p_neg_inf == 0.0 {
                MaskCase::None
            } else {
                MaskCase::Additive {
                    bcast: [false, false, false],
                    keys: KeyAxis::Full,
                    fill: if i % 2 == 0 {
                        f32::NEG_INFINITY
                    } else {
                        f32::MIN
                    },
                    p_masked: p_neg_inf,
                    masked_rows: true,
                }
            },
            causal,
            softcap: if i == 2 { Some(3.0) } else { None },
            scale: AttentionParams::default_scale(64),
            amplitude: 2.0,
            seed: 40 + i as u64,
        };
        pool.install(|| run_case(&c)).unwrap();
    }
}

/// A few larger shapes crossing several key blocks, query blocks and tasks of every ISA (96-key
/// tiles; 64-query blocks, 4 per AVX-512 task), where block boundaries, causal block skipping and
/// the online rescaling matter.
#[test]
fn multi_block_shapes_match_reference() {
    for (i, (lq, lk, d, causal)) in [
        (130, 200, 64, None),
        (200, 130, 80, Some(0)),
        (97, 300, 32, Some(150)),
        (65, 193, 128, Some(-3)),
        (300, 150, 64, Some(-20)),
        (530, 530, 16, Some(0)),
        (1, 500, 64, None),
        (3, 300, 48, Some(297)),
    ]
    .into_iter()
    .enumerate()
    {
        let c = Case {
            b: 1,
            hkv: 2,
            ratio: 2,
            lq,
            lk,
            d,
            dv: d,
            layouts: [Layout::Bshd, Layout::Bhld, Layout::Padded, Layout::Bshd],
            mask: if i % 2 == 0 {
                MaskCase::None
            } else {
                MaskCase::Additive {
                    bcast: [false, true, false],
                    keys: KeyAxis::Full,
                    fill: if i % 4 == 1 {
                        f32::NEG_INFINITY
                    } else {
                        f32::MIN
                    },
                    p_masked: 0.2,
                    masked_rows: true,
                }
            },
            causal,
            softcap: None,
            scale: AttentionParams::default_scale(d),
            amplitude: 2.0,
            seed: 7 + i as u64,
        };
        run_case(&c).unwrap();
    }
}
