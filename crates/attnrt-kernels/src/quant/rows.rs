//! The activations of an integer projection, quantized and widened: each value minus the zero
//! point, as i16, row by row (rows padded to an even length and to a multiple of [`MR`] rows
//! with zeros). Made by ONNX's `DynamicQuantizeLinear` ([`QuantizedRows::quantize_dynamic`]),
//! or from activations already quantized ([`QuantizedRows::from_u8`]). A VNNI build multiplies
//! u8 codes instead: each value plus the rows' shift ([`QuantizedRows::codes`]).

use rayon::prelude::*;

use super::portable::{quantize, range, scale_and_zero_point};
use super::{avx2, avx512, Build, QuantKernel, Vnni, MR};
use crate::threads::ThreadPolicy;

/// `m` rows of `k` quantized activations minus their zero point (see the module docs), with the
/// scale and zero point they were quantized with.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuantizedRows {
    m: usize,
    k: usize,
    data: Vec<i16>,
    scale: f32,
    zero_point: i32,
    /// What each value plus it is in `[0, 255]`: the zero point of uint8 activations, the
    /// zero point + 128 of int8 ones.
    shift: i32,
}

impl QuantizedRows {
    /// ONNX `DynamicQuantizeLinear` of `x: [m, k]` (row-major), to uint8:
    /// `scale = (max(0, max x) − min(0, min x)) / 255`,
    /// `zero_point = saturate(round(−min(0, min x) / scale))`,
    /// `q = saturate(round(x / scale) + zero_point)`, rounding half to even, NaNs ignored by
    /// the range and quantized as 0 + `zero_point`; a zero range gives scale 0, zero point 0
    /// and zeros (what tract-onnx's op computes, bit for bit).
    ///
    /// # Panics
    /// If `x` is not `m·k` long.
    pub fn quantize_dynamic(
        kernel: &QuantKernel,
        threads: &ThreadPolicy,
        x: &[f32],
        m: usize,
        k: usize,
    ) -> QuantizedRows {
        assert_eq!(x.len(), m * k, "x is not {m}×{k}");
        // The 512-bit VNNI form is chosen only on CPUs with AVX512F (and AVX2).
        let wide = kernel.vnni == Some(Vnni::Zmm);
        let (min, max) = match kernel.build {
            // SAFETY: as just said.
            Build::Avx2 if wide => unsafe { avx512::range(x) },
            // SAFETY: the AVX2 build is chosen only on CPUs with AVX2.
            Build::Avx2 => unsafe { avx2::range(x) },
            Build::Portable => range(x),
        };
        let (scale, zero_point) = scale_and_zero_point(min, max);
        let mut rows = QuantizedRows::zeros(m, k, scale, i32::from(zero_point));
        let stride = rows.stride();
        if stride == 0 {
            return rows;
        }
        let quantize_rows = |(chunk, out): (usize, &mut [i16])| {
            for (r, out) in out.chunks_exact_mut(stride).enumerate() {
                let i = chunk + r;
                if i < m {
                    let xs = &x[i * k..(i + 1) * k];
                    match kernel.build {
                        // SAFETY: as above.
                        Build::Avx2 if wide => unsafe {
                            avx512::quantize(xs, scale, zero_point, out)
                        },
                        // SAFETY: as above.
                        Build::Avx2 => unsafe { avx2::quantize(xs, scale, zero_point, out) },
                        Build::Portable => quantize(xs, scale, zero_point, out),
                    }
                }
            }
        };
        if threads.spreads_values(m * k) {
            let per_task = threads.rows_per_task(m).next_multiple_of(MR);
            rows.data
                .par_chunks_mut(per_task * stride)
                .enumerate()
                .map(|(t, c)| (t * per_task, c))
                .for_each(quantize_rows);
        } else {
            quantize_rows((0, &mut rows.data));
        }
        rows
    }

    /// Activations already quantized to uint8, `a: [m, k]`, with zero point `zero_point`; the
    /// scale is 1.
    ///
    /// # Panics
    /// If `a` is not `m·k` long.
    pub fn from_u8(a: &[u8], m: usize, k: usize, zero_point: u8) -> QuantizedRows {
        Self::widen(m, k, a, i32::from(zero_point), 0)
    }

    /// [`QuantizedRows::from_u8`] for int8 activations.
    ///
    /// # Panics
    /// If `a` is not `m·k` long.
    pub fn from_i8(a: &[i8], m: usize, k: usize, zero_point: i8) -> QuantizedRows {
        Self::widen(m, k, a, i32::from(zero_point), 128)
    }

    /// `a` minus `zero_point`, the u8 codes being `a + lift`.
    fn widen<T: Copy + Into<i32>>(
        m: usize,
        k: usize,
        a: &[T],
        zero_point: i32,
        lift: i32,
    ) -> QuantizedRows {
        assert_eq!(a.len(), m * k, "a is not {m}×{k}");
        let mut rows = QuantizedRows::zeros(m, k, 1.0, zero_point);
        rows.shift = zero_point + lift;
        let stride = rows.stride();
        if k == 0 {
            return rows;
        }
        // Row by row over slices, so that the loop vectorizes.
        for (out, a) in rows.data.chunks_exact_mut(stride).zip(a.chunks_exact(k)) {
            for (o, &v) in out.iter_mut().zip(a) {
                // Both in [−128, 255]: the difference fits i16.
                *o = (v.into() - zero_point) as i16;
            }
        }
        rows
    }

    fn zeros(m: usize, k: usize, scale: f32, zero_point: i32) -> QuantizedRows {
        let stride = 2 * k.div_ceil(2);
        QuantizedRows {
            m,
            k,
            data: vec![0; m.next_multiple_of(MR) * stride],
            scale,
            zero_point,
            shift: zero_point,
        }
    }

    /// Rows.
    pub fn m(&self) -> usize {
        self.m
    }

    /// Values per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The scale the rows were quantized with.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// The zero point the rows were quantized with.
    pub fn zero_point(&self) -> i32 {
        self.zero_point
    }

    /// Values from one row to the next in [`QuantizedRows::data`] (`k` rounded up to even).
    pub(crate) fn stride(&self) -> usize {
        2 * self.k.div_ceil(2)
    }

    /// The widened values, `⌈m / MR⌉·MR` rows of [`QuantizedRows::stride`].
    pub(crate) fn data(&self) -> &[i16] {
        &self.data
    }

    /// The u8 codes a VNNI build multiplies: each value plus [`QuantizedRows::shift`], in rows
    /// of `k` rounded up to a multiple of 4 (the padding 0), as many rows as
    /// [`QuantizedRows::data`].
    pub(crate) fn codes(&self) -> Vec<u8> {
        let (stride, k) = (self.stride(), self.k);
        let codes_stride = k.next_multiple_of(4);
        let mut codes = vec![0u8; self.data.len() / stride.max(1) * codes_stride];
        if k == 0 {
            return codes;
        }
        let shift = self.shift as i16;
        for (out, row) in codes
            .chunks_exact_mut(codes_stride)
            .zip(self.data.chunks_exact(stride))
        {
            for (o, &v) in out.iter_mut().zip(&row[..k]) {
                // In [0, 255] by the shift's definition (the padding rows give the shift).
                *o = v.wrapping_add(shift) as u8;
            }
        }
        codes
    }

    /// What the values plus it are the u8 codes of: the zero point of uint8 activations, the
    /// zero point + 128 of int8 ones.
    pub(crate) fn shift(&self) -> i32 {
        self.shift
    }

    /// The quantized value of row `i`, column `p`, minus the zero point.
    pub fn centered(&self, i: usize, p: usize) -> i32 {
        i32::from(self.data[i * self.stride() + p])
    }

    /// How many of the `m·k` values stand for a different number of quantization steps than
    /// in `other` (their centered values differ: a code flipped, or the zero point moved); all
    /// `m·k` when the two are not of one shape.
    pub fn steps_differing(&self, other: &QuantizedRows) -> usize {
        if (self.m, self.k) != (other.m, other.k) {
            return self.m * self.k;
        }
        (0..self.m)
            .flat_map(|i| (0..self.k).map(move |p| (i, p)))
            .filter(|&(i, p)| self.centered(i, p) != other.centered(i, p))
            .count()
    }
}
