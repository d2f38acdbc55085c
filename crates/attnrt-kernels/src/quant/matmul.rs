//! The integer product of [`QuantizedRows`] by a [`QuantizedWeight`], split into tasks of up to
//! [`ROWS`] rows × [`PANELS`] panels, each micro-kernel tile (`MR × NR` i32 sums, exact) stored
//! through the output's epilogue as it is finished.

use rayon::prelude::*;

use super::vnni::{self, Operands};
use super::weight::{Panel, Quads};
use super::{
    avx2, portable, Build, QuantKernel, QuantizedRows, QuantizedWeight, Requantize, Vnni, MR, NR,
    PANELS,
};
use crate::act::{apply_rows_raw, ActKernel, Activation};
use crate::threads::ThreadPolicy;

/// Most rows per task (a multiple of `MR`): a task's narrow panels are widened once for all
/// its rows, so it takes as many rows as it can while the tasks still keep every thread busy.
const MAX_ROWS: usize = 256;
/// Fewest rows per task when the rows are split to make tasks (a multiple of `MR`).
const MIN_ROWS: usize = 32;
/// Tasks per thread the split aims for, at least: enough that a thread the OS takes away for a
/// while leaves its tasks to the others (BERT-base's 768 × 768 projections at 128 tokens keep
/// main's 64-row blocks, 24 tasks; the 768 × 3072 ones take all 128 rows, 48 tasks).
const TASKS_PER_THREAD: usize = 8;

/// Where [`quant_matmul`] stores `y[m×n]` (row-major) and how.
#[derive(Debug)]
pub enum QuantOutput<'a> {
    /// The i32 sums themselves (`MatMulInteger`).
    Int(&'a mut [i32]),
    /// `f32(sum) · scale[j]`, then `requantize`, then `+ bias[j]`, then `activation` (on the act
    /// kernel given): the rounding steps of `Cast`, `Mul`, `QuantizeLinear` and
    /// `DequantizeLinear`, and `Add` nodes.
    Float {
        /// The output.
        y: &'a mut [f32],
        /// Per column, `[n]`: the activations' scale times the weight's.
        scale: &'a [f32],
        /// The round trip of each value through an 8-bit type (a QDQ model's output
        /// quantization), before the bias.
        requantize: Option<Requantize>,
        /// Per column, `[n]`.
        bias: Option<&'a [f32]>,
        /// Applied to every value after the bias.
        activation: Option<(ActKernel, Activation)>,
    },
}

/// The output pointer the tasks share; each writes its own block.
#[derive(Clone, Copy)]
enum Sink<'a> {
    Int(*mut i32),
    Float {
        y: *mut f32,
        scale: &'a [f32],
        requantize: Option<Requantize>,
        bias: Option<&'a [f32]>,
    },
}
// SAFETY: used only inside `quant_matmul`, whose tasks write disjoint blocks of an output
// borrowed mutably for the whole call.
unsafe impl Send for Sink<'_> {}
unsafe impl Sync for Sink<'_> {}

/// `y = a · w` through `out`'s epilogue, on `kernel`, the tasks on the current rayon pool when
/// `threads` spreads them.
///
/// # Panics
/// If the sizes disagree (`a.k() != w.k()`, an output not `m·n` long, `scale` or `bias` not
/// `n` long).
pub fn quant_matmul(
    kernel: &QuantKernel,
    threads: &ThreadPolicy,
    a: &QuantizedRows,
    w: &QuantizedWeight,
    out: QuantOutput,
) {
    let (m, n) = (a.m(), w.n());
    assert_eq!(a.k(), w.k(), "activations and weight disagree on k");
    let (sink, activation) = match out {
        QuantOutput::Int(y) => {
            assert_eq!(y.len(), m * n);
            (Sink::Int(y.as_mut_ptr()), None)
        }
        QuantOutput::Float {
            y,
            scale,
            requantize,
            bias,
            activation,
        } => {
            assert!(y.len() == m * n && scale.len() == n);
            assert!(bias.is_none_or(|b| b.len() == n));
            let y = y.as_mut_ptr();
            let sink = Sink::Float {
                y,
                scale,
                requantize,
                bias,
            };
            (sink, activation)
        }
    };
    let chunks = w.panels().div_ceil(PANELS);
    let row_block = rows_per_task(m, chunks, threads.threads());
    let tasks = m.div_ceil(row_block) * chunks;
    // A weight in quads multiplies the rows' u8 codes, made once for all tasks.
    let quads = w.quads().map(|q| (q, a.codes()));
    let task = |t: usize| {
        let (r0, c0) = ((t / chunks) * row_block, (t % chunks) * PANELS);
        let rows = row_block.min(m - r0);
        if let Some((q, codes)) = &quads {
            quad_task(kernel, sink, a, codes, *q, (r0, rows), c0, w);
        } else {
            pair_task(kernel, sink, a, w, (r0, rows), c0);
        }
        if let (Some((act_kernel, act)), Sink::Float { y, .. }) = (activation, sink) {
            let cols = (c0 * NR)..((c0 + PANELS) * NR).min(n);
            // SAFETY: the block this task has just written.
            unsafe {
                let block = y.add(r0 * n + cols.start);
                apply_rows_raw(act_kernel, act, block, n, rows, cols.len());
            }
        }
    };
    if threads.spreads_tasks(tasks) {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// One task of a weight in i16 or i8 pairs: `rows` rows from `r0` by panels `c0..c0 +
/// PANELS`, stored through `sink`.
fn pair_task(
    kernel: &QuantKernel,
    sink: Sink,
    a: &QuantizedRows,
    w: &QuantizedWeight,
    (r0, rows): (usize, usize),
    c0: usize,
) {
    let (m, n) = (a.m(), w.n());
    // A narrow panel is widened once per task for the multi-row tiles, which reuse each
    // loaded value for MR rows; a lone row reads it narrow (its cost is the bytes).
    let mut widened = Vec::new();
    for c in c0..(c0 + PANELS).min(w.panels()) {
        let panel = match w.panel(c) {
            Panel::Narrow(p) if rows > 1 => {
                widen(kernel, p, &mut widened);
                Panel::Wide(&widened)
            }
            panel => panel,
        };
        for r in (r0..r0 + rows).step_by(MR) {
            let acc = tile(kernel, a, r, panel, w.k_pairs());
            let (rows, col) = (MR.min(m - r), c * NR);
            let block = Block {
                r,
                rows,
                col,
                cols: NR.min(n - col),
                n,
            };
            // SAFETY: rows r.., columns c·NR.. of the output belong to this task alone.
            unsafe { store(kernel, sink, &acc, block) };
        }
    }
}

/// One task of a weight in quads: `rows` rows from `r0` (of `a`, whose u8 codes are `codes`)
/// by panels `c0..c0 + PANELS` (the weight's are padded to a multiple of `PANELS`), on the
/// kernel's VNNI form (portable without one), stored through `sink`.
#[allow(clippy::too_many_arguments)]
fn quad_task(
    kernel: &QuantKernel,
    sink: Sink,
    a: &QuantizedRows,
    codes: &[u8],
    q: Quads,
    (r0, rows): (usize, usize),
    c0: usize,
    w: &QuantizedWeight,
) {
    let (m, n) = (a.m(), w.n());
    let stride = 4 * q.k_quads;
    let panel_len = q.panel_len();
    let values = &q.values[c0 * panel_len..(c0 + PANELS) * panel_len];
    let sums = &q.sums[c0 * NR..(c0 + PANELS) * NR];
    for r in (r0..r0 + rows).step_by(MR) {
        let operands = Operands {
            a: codes[r * stride..(r + MR) * stride].as_ptr(),
            stride,
            w: values.as_ptr(),
            panel_len,
            sums: sums.as_ptr(),
            k_quads: q.k_quads,
            shift: a.shift(),
        };
        let live = MR.min(m - r);
        // SAFETY: the operands hold MR rows of codes and PANELS panels, as sliced above; each
        // VNNI form is chosen only on CPUs that have it.
        let acc = unsafe {
            match (kernel.vnni, live) {
                (Some(Vnni::Zmm), 1) => vnni::row_zmm(operands),
                (Some(Vnni::Zmm), _) => vnni::tile_zmm(operands),
                (Some(Vnni::Ymm), 1) => vnni::row_ymm(operands),
                (Some(Vnni::Ymm), _) => vnni::tile_ymm(operands),
                (None, _) => vnni::portable(operands),
            }
        };
        for (c, acc) in (c0..(c0 + PANELS).min(w.panels())).zip(&acc) {
            let col = c * NR;
            let block = Block {
                r,
                rows: live,
                col,
                cols: NR.min(n - col),
                n,
            };
            // SAFETY: rows r.., columns c·NR.. of the output belong to this task alone.
            unsafe { store(kernel, sink, acc, block) };
        }
    }
}

/// Rows per task for `m` rows and `chunks` groups of panels on `threads` threads: all of them
/// (up to [`MAX_ROWS`]) while there are at least [`TASKS_PER_THREAD`] tasks per thread, else
/// halved down to [`MIN_ROWS`]. Always a multiple of `MR`, at least `MR`.
pub(super) fn rows_per_task(m: usize, chunks: usize, threads: usize) -> usize {
    let want = TASKS_PER_THREAD * threads.max(1);
    let mut rows = m.next_multiple_of(MR).clamp(MR, MAX_ROWS);
    while rows > MIN_ROWS && m.div_ceil(rows) * chunks < want {
        rows = (rows / 2).next_multiple_of(MR).max(MIN_ROWS);
    }
    rows
}

/// `out = p` widened to i16, on `kernel`'s build.
fn widen(kernel: &QuantKernel, p: &[i8], out: &mut Vec<i16>) {
    out.clear();
    out.resize(p.len(), 0);
    match kernel.build {
        // SAFETY: the AVX2 build is chosen only on CPUs with AVX2.
        Build::Avx2 => unsafe { avx2::widen(p, out) },
        Build::Portable => portable::widen(p, out),
    }
}

/// The `MR × NR` sums of rows `r..r + MR` of `a` by `panel` (`k_pairs` row pairs), on
/// `kernel`'s build. A last row alone (a decode step's one token) runs on the one-row kernel,
/// which reads either width (the other rows of the tile are left 0: they are padding); the
/// multi-row AVX2 tile reads i16 (the caller widens narrow panels for it).
fn tile(
    kernel: &QuantKernel,
    a: &QuantizedRows,
    r: usize,
    panel: Panel,
    k_pairs: usize,
) -> [[i32; NR]; MR] {
    let stride = a.stride();
    let rows = &a.data()[r * stride..(r + MR) * stride];
    let (live, ap) = (a.m() - r, rows.as_ptr());
    let one_row = |sums: [i32; NR]| {
        let mut t = [[0; NR]; MR];
        t[0] = sums;
        t
    };
    // SAFETY (each AVX2 call): the AVX2 build is chosen only on CPUs with AVX2; `rows` holds
    // MR rows of `stride = 2·k_pairs` values and the panel k_pairs·NR·2 values of its type.
    match (kernel.build, panel) {
        (Build::Avx2, Panel::Narrow(p)) if live == 1 => {
            one_row(unsafe { avx2::row::<true>(ap, p.as_ptr().cast(), k_pairs) })
        }
        (Build::Avx2, Panel::Wide(p)) if live == 1 => {
            one_row(unsafe { avx2::row::<false>(ap, p.as_ptr().cast(), k_pairs) })
        }
        (Build::Avx2, Panel::Wide(p)) => unsafe { avx2::tile(ap, stride, p.as_ptr(), k_pairs) },
        (_, Panel::Narrow(p)) => portable_tile(rows, stride, p, k_pairs),
        (_, Panel::Wide(p)) => portable_tile(rows, stride, p, k_pairs),
    }
}

/// [`avx2::tile`] in plain Rust: the same pair sums (each exact in i32), the same wrapping adds.
pub(super) fn portable_tile<T: Copy + Into<i32>>(
    a: &[i16],
    stride: usize,
    panel: &[T],
    k_pairs: usize,
) -> [[i32; NR]; MR] {
    let mut acc = [[0i32; NR]; MR];
    for p in 0..k_pairs {
        let w = &panel[p * 2 * NR..(p + 1) * 2 * NR];
        for (r, acc) in acc.iter_mut().enumerate() {
            let a0 = i32::from(a[r * stride + 2 * p]);
            let a1 = i32::from(a[r * stride + 2 * p + 1]);
            for (j, acc) in acc.iter_mut().enumerate() {
                let pair = a0 * w[2 * j].into() + a1 * w[2 * j + 1].into();
                *acc = acc.wrapping_add(pair);
            }
        }
    }
    acc
}

/// Where a tile's sums go: `rows × cols` of them at row `r`, column `col` of the `[m, n]`
/// output.
#[derive(Clone, Copy)]
struct Block {
    r: usize,
    rows: usize,
    col: usize,
    cols: usize,
    n: usize,
}

/// Stores `acc` at `block`, on `kernel`'s build (the same roundings on both: `f32(sum) ·
/// scale`, then `+ bias`).
///
/// # Safety
/// The block must lie inside the output and be written by nothing else meanwhile.
unsafe fn store(kernel: &QuantKernel, sink: Sink, acc: &[[i32; NR]; MR], block: Block) {
    // SAFETY: as the caller vouches; the AVX2 build is chosen only on CPUs with AVX2.
    unsafe {
        match kernel.build {
            Build::Avx2 => store_avx2(sink, acc, block),
            Build::Portable => store_rows(sink, acc, block, portable::requantize_in_place),
        }
    }
}

/// [`store_rows`] compiled for AVX2 (its loops vectorize 8 wide; no FMA: the multiply and the
/// add round separately, as on the portable build).
///
/// # Safety
/// As [`store`]; the CPU must have AVX2.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2"))]
unsafe fn store_avx2(sink: Sink, acc: &[[i32; NR]; MR], block: Block) {
    // SAFETY: as the caller vouches; the CPU has AVX2.
    unsafe { store_rows(sink, acc, block, avx2::requantize_in_place) }
}

/// The epilogue of [`store`] in plain Rust, the round trip of a row's values by `requantize`.
///
/// # Safety
/// As [`store`]; `requantize` must run on this CPU.
#[inline(always)]
unsafe fn store_rows(
    sink: Sink,
    acc: &[[i32; NR]; MR],
    block: Block,
    requantize_row: unsafe fn(&mut [f32], Requantize),
) {
    let Block {
        r,
        rows,
        col,
        cols,
        n,
    } = block;
    for (i, acc) in acc.iter().enumerate().take(rows) {
        let at = (r + i) * n + col;
        match sink {
            Sink::Int(y) => {
                // SAFETY: inside the output, as the caller vouches.
                let y = unsafe { std::slice::from_raw_parts_mut(y.add(at), cols) };
                y.copy_from_slice(&acc[..cols]);
            }
            Sink::Float {
                y,
                scale,
                requantize: rq,
                bias,
            } => {
                // SAFETY: as above.
                let y = unsafe { std::slice::from_raw_parts_mut(y.add(at), cols) };
                let scale = &scale[col..col + cols];
                for ((y, &s), &v) in y.iter_mut().zip(scale).zip(acc) {
                    *y = v as f32 * s;
                }
                if let Some(rq) = rq {
                    // SAFETY: as the caller vouches.
                    unsafe { requantize_row(y, rq) };
                }
                if let Some(b) = bias {
                    for (y, &b) in y.iter_mut().zip(&b[col..col + cols]) {
                        *y += b;
                    }
                }
            }
        }
    }
}
