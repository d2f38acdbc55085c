//! Every build against plain references: exact equality of the i32 sums, of the quantized
//! activations, and of the float epilogue (the same roundings in the same order).

use proptest::prelude::*;

use super::*;
use crate::act::{ActKernel, Activation};
use crate::testing::pool;
use crate::threads::ThreadPolicy;

fn kernels() -> Vec<QuantKernel> {
    QuantKernel::every_build()
}

/// The portable build.
fn portable() -> QuantKernel {
    QuantKernel::new(Isa::Scalar, &crate::isa::Cpu::probe())
}

/// `Σ_p (a[i,p] − za)·(w[p,j] − zw[j])` in i64 (no overflow at these sizes).
fn reference(a: &[u8], za: u8, w: &[i8], zw: &[i8], m: usize, k: usize, n: usize) -> Vec<i64> {
    let mut y = vec![0i64; m * n];
    for i in 0..m {
        for j in 0..n {
            let z = i64::from(zw[if zw.len() == n { j } else { 0 }]);
            y[i * n + j] = (0..k)
                .map(|p| (i64::from(a[i * k + p]) - i64::from(za)) * (i64::from(w[p * n + j]) - z))
                .sum();
        }
    }
    y
}

/// ONNX's `DynamicQuantizeLinear`, written from the spec: the values (not minus the zero
/// point), the scale and the zero point.
fn dql_reference(x: &[f32]) -> (Vec<u8>, f32, u8) {
    let finite = x.iter().copied().filter(|v| !v.is_nan());
    let min = finite.clone().fold(0f32, f32::min);
    let max = finite.fold(0f32, f32::max);
    let scale = (max - min) / 255.0;
    let zp = (-min / scale).round_ties_even();
    let zp = if zp.is_nan() {
        0
    } else {
        zp.clamp(0.0, 255.0) as u8
    };
    let q = x
        .iter()
        .map(|&v| {
            let r = (v / scale).round_ties_even();
            let r = if r.is_nan() { 0.0 } else { r };
            (f64::from(r) + f64::from(zp)).clamp(0.0, 255.0) as u8
        })
        .collect();
    (q, scale, zp)
}

type MatmulCase = (usize, usize, usize, Vec<u8>, u8, Vec<i8>, Vec<i8>);

/// Random products of up to `m_max − 1` rows and `k_max − 1` reduced values; zero points per
/// column or per tensor, or (`symmetric`) 0, which packs the weight as i8.
fn matmul_case(m_max: usize, k_max: usize, symmetric: bool) -> impl Strategy<Value = MatmulCase> {
    (1usize..m_max, 0usize..k_max, 1usize..41, any::<bool>()).prop_flat_map(
        move |(m, k, n, per_col)| {
            let zero_points = if symmetric {
                Just(vec![0i8]).boxed()
            } else {
                proptest::collection::vec(any::<i8>(), if per_col { n } else { 1 }).boxed()
            };
            (
                Just(m),
                Just(k),
                Just(n),
                proptest::collection::vec(any::<u8>(), m * k),
                any::<u8>(),
                proptest::collection::vec(any::<i8>(), k * n),
                zero_points,
            )
        },
    )
}

/// The i32 sums of `rows` by `packed` on `kernel`, on the calling thread's pool.
fn int_sums(kernel: &QuantKernel, rows: &QuantizedRows, packed: &QuantizedWeight) -> Vec<i32> {
    let mut sums = vec![i32::MIN; rows.m() * packed.n()];
    let out = QuantOutput::Int(&mut sums);
    quant_matmul(kernel, &ThreadPolicy::default(), rows, packed, out);
    sums
}

/// Every build's i32 sums of `case` equal the i64 reference.
fn exact_on_every_build((m, k, n, a, za, w, zw): MatmulCase) -> Result<(), TestCaseError> {
    let want = reference(&a, za, &w, &zw, m, k, n);
    let rows = QuantizedRows::from_u8(&a, m, k, za);
    if zw.iter().all(|&z| z == 0) {
        prop_assert!(QuantizedWeight::from_i8(&portable(), &w, k, n, &zw).is_narrow());
    }
    for kernel in kernels() {
        let packed = QuantizedWeight::from_i8(&kernel, &w, k, n, &zw);
        let mut y = vec![i32::MIN; m * n];
        quant_matmul(
            &kernel,
            &ThreadPolicy::default(),
            &rows,
            &packed,
            QuantOutput::Int(&mut y),
        );
        let got: Vec<i64> = y.iter().map(|&v| i64::from(v)).collect();
        prop_assert_eq!(&got, &want, "{}", kernel);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_integer_sums_are_exact_on_every_build(case in matmul_case(23, 70, false)) {
        exact_on_every_build(case)?;
    }

    /// Symmetric int8 weights (zero points 0) are packed as i8, and a lone last row (every
    /// decode step) runs on the one-row kernel: the same exact sums on every build.
    #[test]
    fn narrow_weights_and_single_rows_give_the_exact_sums(case in matmul_case(7, 300, true)) {
        exact_on_every_build(case)?;
    }

    #[test]
    fn dynamic_quantization_is_onnx_s_on_every_build(
        (m, k, x) in (1usize..9, 0usize..70).prop_flat_map(|(m, k)| {
            (Just(m), Just(k), proptest::collection::vec(-1e3f32..1e3, m * k))
        }),
        ties in any::<bool>(),
    ) {
        // Multiples of 0.5 in (−127.5, 127.5): with a range of 255 the scale is exactly 1 and
        // the halves are ties.
        let x: Vec<f32> = if ties {
            x.iter().map(|v| (v / 8.0).round() / 2.0 % 127.5).collect()
        } else {
            x
        };
        let (q, scale, zp) = dql_reference(&x);
        for kernel in kernels() {
            let threads = ThreadPolicy::default();
            let rows = QuantizedRows::quantize_dynamic(&kernel, &threads, &x, m, k);
            prop_assert_eq!(rows.scale().to_bits(), scale.to_bits());
            prop_assert_eq!(rows.zero_point(), i32::from(zp));
            for (i, &q) in q.iter().enumerate() {
                let got = rows.centered(i / k, i % k) + i32::from(zp);
                prop_assert_eq!(got, i32::from(q), "{} x[{}] = {}", kernel, i, x[i]);
            }
        }
    }
}

#[test]
fn dynamic_quantization_handles_zeros_nans_and_infinities_as_the_portable_path() {
    let cases: [&[f32]; 5] = [
        &[0.0; 19],
        &[-0.0, 0.0, -0.0, 1.0, -2.0, 0.5, 0.25, 3.0, 4.0, 5.0],
        &[
            f32::NAN,
            1.0,
            -1.0,
            2.0,
            f32::NAN,
            0.0,
            0.0,
            7.0,
            -3.0,
            1.5,
            f32::NAN,
        ],
        &[f32::INFINITY, 1.0, -1.0, 2.0, 0.0, 0.0, 0.0, 7.0, -3.0, 1.5],
        &[1e-44, 2e-45, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    ];
    let portable = portable();
    // Each case as it is (the vector builds' tails), and repeated past three 16-wide vectors.
    let long: Vec<Vec<f32>> = cases
        .iter()
        .map(|x| x.iter().cycle().take(50).copied().collect())
        .collect();
    for x in cases.iter().copied().chain(long.iter().map(Vec::as_slice)) {
        let want =
            QuantizedRows::quantize_dynamic(&portable, &ThreadPolicy::default(), x, 1, x.len());
        for kernel in kernels() {
            let got =
                QuantizedRows::quantize_dynamic(&kernel, &ThreadPolicy::default(), x, 1, x.len());
            assert_eq!(
                got.scale().to_bits(),
                want.scale().to_bits(),
                "{kernel} {x:?}"
            );
            assert_eq!(got, want, "{kernel} {x:?}");
        }
    }
    let zeros =
        QuantizedRows::quantize_dynamic(&portable, &ThreadPolicy::default(), cases[0], 1, 19);
    assert_eq!((zeros.scale(), zeros.zero_point()), (0.0, 0));
    assert!((0..19).all(|p| zeros.centered(0, p) == 0));
}

#[test]
fn the_float_epilogue_rounds_as_cast_mul_add_and_threads_change_nothing() {
    // m·k past `ThreadPolicy`'s serial limit, so the quantization is split too.
    let (m, k, n) = (330, 101, 70);
    let x: Vec<f32> = crate::testing::ramp(m * k, 0.3);
    let w: Vec<u8> = (0..k * n).map(|i| (i * 37 % 251) as u8).collect();
    let zw: Vec<u8> = (0..n).map(|j| (j * 13 % 200) as u8).collect();
    let w_scale: Vec<f32> = (0..n).map(|j| 0.001 * (j as f32 + 1.0)).collect();
    let bias: Vec<f32> = crate::testing::ramp(n, 1.7);
    let threads = ThreadPolicy::default();
    for kernel in kernels() {
        let packed = QuantizedWeight::from_u8(&kernel, &w, k, n, &zw);
        let rows = QuantizedRows::quantize_dynamic(&kernel, &threads, &x, m, k);
        let split =
            pool(2).install(|| QuantizedRows::quantize_dynamic(&kernel, &threads, &x, m, k));
        assert_eq!(rows, split, "{kernel}");
        let scale: Vec<f32> = w_scale.iter().map(|s| rows.scale() * s).collect();
        let sums = int_sums(&kernel, &rows, &packed);
        for act in [None, Some(Activation::GeluErf)] {
            let mut y = vec![f32::NAN; m * n];
            let activation = act.map(|a| (ActKernel::new(Isa::Scalar), a));
            let out = QuantOutput::Float {
                y: &mut y,
                scale: &scale,
                requantize: None,
                bias: Some(&bias),
                activation,
            };
            pool(2).install(|| quant_matmul(&kernel, &threads, &rows, &packed, out));
            for (i, (&y, &s)) in y.iter().zip(&sums).enumerate() {
                let j = i % n;
                let mut want = s as f32 * scale[j] + bias[j];
                if let Some(act) = act {
                    let mut v = [want];
                    crate::act::apply_rows(ActKernel::new(Isa::Scalar), act, &mut v, 1, 1, 1);
                    want = v[0];
                }
                assert_eq!(y.to_bits(), want.to_bits(), "{kernel} {act:?} y[{i}]");
            }
        }
    }
}

/// `steps_differing` counts the values whose distance from the zero point changed: a flipped
/// code, or a moved zero point; a shape mismatch counts every value.
#[test]
fn steps_differing_counts_flipped_codes_and_moved_zero_points() {
    let a = QuantizedRows::from_u8(&[10, 20, 30, 40], 2, 2, 10);
    assert_eq!(a.steps_differing(&a), 0);
    let flipped = QuantizedRows::from_u8(&[10, 21, 30, 40], 2, 2, 10);
    assert_eq!(a.steps_differing(&flipped), 1);
    let moved = QuantizedRows::from_u8(&[10, 20, 30, 40], 2, 2, 11);
    assert_eq!(a.steps_differing(&moved), 4);
    let other_shape = QuantizedRows::from_u8(&[10, 20, 30, 40], 1, 4, 10);
    assert_eq!(a.steps_differing(&other_shape), 4);
}

/// Values that do not fit i8 once their zero point is subtracted keep the i16 packing, at two
/// bytes a value.
#[test]
fn weights_past_i8_after_their_zero_point_stay_wide() {
    let kernel = portable();
    let narrow = QuantizedWeight::from_i8(&kernel, &[-128, 127, 5, 6], 2, 2, &[0]);
    assert!(narrow.is_narrow() && !narrow.is_quads());
    assert_eq!(narrow.bytes(), NR * 2);
    let wide = QuantizedWeight::from_i8(&kernel, &[-128, 127, 5, 6], 2, 2, &[1]);
    assert!(!wide.is_narrow());
    assert_eq!(wide.bytes(), NR * 2 * 2);
    assert!(!QuantizedWeight::from_u8(&kernel, &[200, 1, 2, 3], 2, 2, &[0]).is_narrow());
    assert!(QuantizedWeight::from_u8(&kernel, &[200, 1, 2, 3], 2, 2, &[128]).is_narrow());
}

/// Narrow (i8) weights over more rows than one task takes, on pools of 1 to 3 threads: the
/// rows are split into several blocks, each widening its panels once, and every build and
/// split gives the exact sums and the same float epilogue, bit for bit.
#[test]
fn narrow_weights_split_over_row_blocks_and_threads_give_the_exact_sums() {
    // 300 rows and 5 panels (2 groups): split into 32- to 64-row blocks.
    let (m, k, n) = (300, 77, 70);
    let a: Vec<u8> = (0..m * k).map(|i| (i * 29 % 256) as u8).collect();
    let w: Vec<i8> = (0..k * n).map(|i| (i * 53 % 256) as u8 as i8).collect();
    let want = reference(&a, 7, &w, &[0], m, k, n);
    let rows = QuantizedRows::from_u8(&a, m, k, 7);
    let scale: Vec<f32> = (0..n).map(|j| 0.003 * (j as f32 + 0.5)).collect();
    let bias: Vec<f32> = crate::testing::ramp(n, 0.4);
    let threads = ThreadPolicy::default();
    let mut first: Option<Vec<f32>> = None;
    for kernel in kernels() {
        let packed = QuantizedWeight::from_i8(&kernel, &w, k, n, &[0]);
        assert!(packed.is_narrow());
        assert_eq!(packed.is_quads(), kernel.is_vnni());
        for pool_threads in [1, 2, 3] {
            let mut sums = vec![i32::MIN; m * n];
            let out = QuantOutput::Int(&mut sums);
            pool(pool_threads).install(|| quant_matmul(&kernel, &threads, &rows, &packed, out));
            let got: Vec<i64> = sums.iter().map(|&v| i64::from(v)).collect();
            assert_eq!(got, want, "{kernel} on {pool_threads} threads");
            let mut y = vec![f32::NAN; m * n];
            let out = QuantOutput::Float {
                y: &mut y,
                scale: &scale,
                requantize: None,
                bias: Some(&bias),
                activation: None,
            };
            pool(pool_threads).install(|| quant_matmul(&kernel, &threads, &rows, &packed, out));
            for (i, (&y, &s)) in y.iter().zip(&sums).enumerate() {
                let want = s as f32 * scale[i % n] + bias[i % n];
                assert_eq!(y.to_bits(), want.to_bits(), "{kernel} y[{i}]");
            }
            match &first {
                Some(f) => assert!(f.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits())),
                None => first = Some(y),
            }
        }
    }
}

/// The rows per task: a multiple of `MR` covering the rows in as few blocks as keep eight tasks
/// per thread, never past `MAX_ROWS` nor, when split, below `MIN_ROWS`.
#[test]
fn rows_per_task_takes_all_rows_while_every_thread_has_tasks() {
    use super::matmul::rows_per_task;
    assert_eq!(rows_per_task(128, 12, 2), 64);
    assert_eq!(rows_per_task(128, 48, 2), 128);
    assert_eq!(rows_per_task(1, 12, 2), MR);
    assert_eq!(rows_per_task(130, 12, 2), 68);
    assert_eq!(rows_per_task(1000, 12, 2), 256);
    // One or two groups of panels: the rows are split down to 32-row blocks.
    assert_eq!(rows_per_task(256, 1, 2), 32);
    assert_eq!(rows_per_task(300, 2, 3), 32);
    // Never below 32 rows, however few the tasks.
    assert_eq!(rows_per_task(40, 1, 8), 32);
    for m in 1..600 {
        for chunks in 1..6 {
            let rows = rows_per_task(m, chunks, 2);
            assert!(
                rows.is_multiple_of(MR) && (MR..=256).contains(&rows),
                "{m} {chunks}: {rows}"
            );
        }
    }
}

/// `from_u8` and `from_i8` give each value minus its zero point, rows padded with zeros; the
/// AVX2 widening of narrow panels equals the portable one on every length.
#[test]
fn quantized_inputs_and_narrow_panels_widen_exactly() {
    let a: Vec<u8> = (0..15).map(|i| (i * 17) as u8).collect();
    let rows = QuantizedRows::from_u8(&a, 3, 5, 200);
    let b: Vec<i8> = a.iter().map(|&v| v as i8).collect();
    let signed = QuantizedRows::from_i8(&b, 3, 5, -3);
    for i in 0..3 {
        for p in 0..5 {
            assert_eq!(rows.centered(i, p), i32::from(a[i * 5 + p]) - 200);
            assert_eq!(signed.centered(i, p), i32::from(b[i * 5 + p]) + 3);
        }
        assert_eq!(rows.centered(i, 5), 0, "the padding of row {i}");
    }
    assert_eq!(QuantizedRows::from_u8(&[], 2, 0, 9).m(), 2);
    let p: Vec<i8> = (0..70).map(|i| (i * 37 % 256) as u8 as i8).collect();
    for len in 0..p.len() {
        let mut want = vec![0i16; len];
        super::portable::widen(&p[..len], &mut want);
        assert!(want.iter().zip(&p).all(|(&w, &v)| w == i16::from(v)));
        if Isa::available().contains(&Isa::Avx2) {
            let mut got = vec![0i16; len];
            // SAFETY: the CPU has AVX2.
            unsafe { super::avx2::widen(&p[..len], &mut got) };
            assert_eq!(got, want, "{len} values");
        }
    }
}

/// The requantized epilogue (a QDQ model's `QuantizeLinear → DequantizeLinear` after the
/// product, then the bias) equals `quantize_linear`'s bytes dequantized as
/// `(q − zero_point) as f32 · scale`, bit for bit, on every build, saturating at both ends.
#[test]
fn the_requantized_epilogue_is_quantize_linear_then_dequantize() {
    let (m, k, n) = (37, 45, 21);
    let a: Vec<u8> = (0..m * k).map(|i| (i * 31 % 256) as u8).collect();
    let w: Vec<i8> = (0..k * n).map(|i| (i * 11 % 256) as u8 as i8).collect();
    let rows = QuantizedRows::from_u8(&a, m, k, 100);
    let scale: Vec<f32> = (0..n).map(|j| 1e-4 * (j as f32 + 1.0)).collect();
    let bias: Vec<f32> = crate::testing::ramp(n, 2.1);
    let threads = ThreadPolicy::default();
    // Values quantized to the low bound, the high bound, and between them.
    let (mut low, mut high, mut inside) = (0, 0, 0);
    for (to, zero_point, q_scale) in [
        (Quantized::U8, 128, 0.01f32),
        (Quantized::I8, -3, 0.004),
        (Quantized::U8, 0, 0.5),
    ] {
        let rq = Requantize {
            scale: q_scale,
            zero_point,
            to,
        };
        for kernel in kernels() {
            let packed = QuantizedWeight::from_i8(&kernel, &w, k, n, &[0]);
            let sums = int_sums(&kernel, &rows, &packed);
            let products: Vec<f32> = (0..m * n).map(|i| sums[i] as f32 * scale[i % n]).collect();
            let mut q = vec![0u8; m * n];
            quantize_linear(
                &kernel, &threads, &products, q_scale, zero_point, to, &mut q,
            );
            let mut y = vec![f32::NAN; m * n];
            let out = QuantOutput::Float {
                y: &mut y,
                scale: &scale,
                requantize: Some(rq),
                bias: Some(&bias),
                activation: None,
            };
            pool(2).install(|| quant_matmul(&kernel, &threads, &rows, &packed, out));
            for i in 0..m * n {
                let q = match to {
                    Quantized::U8 => i32::from(q[i]),
                    Quantized::I8 => i32::from(q[i] as i8),
                };
                let (lo, hi) = to.bounds();
                low += usize::from(q == lo as i32);
                high += usize::from(q == hi as i32);
                inside += usize::from(q > lo as i32 && q < hi as i32);
                let want = (q - zero_point) as f32 * q_scale + bias[i % n];
                assert_eq!(y[i].to_bits(), want.to_bits(), "{kernel} {to:?} y[{i}]");
            }
        }
    }
    assert!(low > 0 && high > 0 && inside > 0, "{low} {high} {inside}");
}

/// Deterministic bytes for the VNNI tests (a multiplicative hash of the index and `seed`).
fn bytes(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| {
            ((i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed << 20)
                >> 13) as u8
        })
        .collect()
}

/// `i64` sums wrapped to i32, as the graph's `MatMulInteger` computes them.
fn wrapped(sums: &[i64]) -> Vec<i32> {
    sums.iter().map(|&v| v as i32).collect()
}

/// The VNNI builds (weights packed in quads, u8 codes, the zero points taken out by the column
/// sums) give the portable build's i32 sums bit for bit: row counts around the tile height
/// (1, 3, 4, 5, 17), `k` not a multiple of 4, `n` not a multiple of a panel nor of a register
/// tile's four panels, uint8 and int8 activations, int8 weights with zero point 0 and uint8
/// weights with a zero point per tensor or per column (values within i8 of them, so narrow).
#[test]
fn vnni_sums_equal_the_portable_build_bit_for_bit() {
    let builds: Vec<QuantKernel> = kernels().into_iter().filter(|k| k.is_vnni()).collect();
    let mut seed = 0;
    for m in [1, 3, 4, 5, 17] {
        for (k, n) in [(1, 1), (3, 17), (5, 70), (64, 16), (67, 130), (130, 65)] {
            seed += 1;
            let a = bytes(m * k, seed);
            let za = a[0];
            let w_i8: Vec<i8> = bytes(k * n, seed + 100).iter().map(|&v| v as i8).collect();
            // uint8 weights within [−100, 100] of their column's zero point, in [100, 155].
            let zw: Vec<u8> = (0..n).map(|j| 100 + (j * 7 % 56) as u8).collect();
            let w_u8: Vec<u8> = (0..k * n)
                .map(|i| (i32::from(zw[i % n]) + i32::from(w_i8[i]).clamp(-100, 100)) as u8)
                .collect();
            let signed: Vec<i8> = a.iter().map(|&v| v as i8).collect();
            let row_sets = [
                QuantizedRows::from_u8(&a, m, k, za),
                QuantizedRows::from_i8(&signed, m, k, -7),
            ];
            for rows in &row_sets {
                let pack = |kernel: &QuantKernel| {
                    [
                        QuantizedWeight::from_i8(kernel, &w_i8, k, n, &[0]),
                        QuantizedWeight::from_u8(kernel, &w_u8, k, n, &zw),
                        QuantizedWeight::from_u8(kernel, &w_u8, k, n, &[zw[0]]),
                    ]
                };
                let want: Vec<Vec<i32>> = pack(&portable())
                    .iter()
                    .map(|w| int_sums(&portable(), rows, w))
                    .collect();
                for kernel in &builds {
                    let packed = pack(kernel);
                    assert!(packed[0].is_quads() && packed[1].is_quads());
                    for (w, want) in packed.iter().zip(&want) {
                        let got = int_sums(kernel, rows, w);
                        assert_eq!(
                            &got,
                            want,
                            "{kernel} m {m} k {k} n {n} quads {}",
                            w.is_quads()
                        );
                    }
                }
            }
        }
    }
}

/// Extreme codes and weights (0 and 255 by −128 and 127) over a `k` long enough that the sums
/// wrap i32: every build wraps as `MatMulInteger`'s i32 arithmetic does, the same bits.
#[test]
fn extreme_values_wrap_i32_the_same_on_every_build() {
    let (m, k, n) = (5, 90_001, 20);
    let a: Vec<u8> = (0..m * k)
        .map(|i| if i % 7 == 6 { 0 } else { 255 })
        .collect();
    let w: Vec<i8> = (0..k * n)
        .map(|i| if (i % n) % 2 == 0 { -128 } else { 127 })
        .collect();
    let want = wrapped(&reference(&a, 0, &w, &[0], m, k, n));
    let unwrapped = reference(&a, 0, &w, &[0], m, k, n);
    assert!(
        unwrapped.iter().any(|&v| i32::try_from(v).is_err()),
        "no sum wraps"
    );
    let rows = QuantizedRows::from_u8(&a, m, k, 0);
    for kernel in kernels() {
        let packed = QuantizedWeight::from_i8(&kernel, &w, k, n, &[0]);
        assert_eq!(int_sums(&kernel, &rows, &packed), want, "{kernel}");
    }
    // Shifted codes (zero point 255, so every centered value is −255 or 0): the correction
    // `shift · Σ w'` wraps too.
    let rows = QuantizedRows::from_u8(&a, m, k, 255);
    let want = wrapped(&reference(&a, 255, &w, &[0], m, k, n));
    for kernel in kernels() {
        let packed = QuantizedWeight::from_i8(&kernel, &w, k, n, &[0]);
        assert_eq!(int_sums(&kernel, &rows, &packed), want, "{kernel}");
    }
}
