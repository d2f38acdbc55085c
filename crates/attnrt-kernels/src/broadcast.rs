//! Element-wise `Add`, `Sub`, `Mul` and `Div` of two float32 tensors under ONNX's
//! multidirectional (numpy) broadcasting, for any pair of shapes that broadcast.
//!
//! [`Broadcast`] aligns the two shapes on the right, drops the axes of size 1 of the result and
//! merges adjacent axes on which the same operands broadcast, so `[4, 12, 1, 64] × [4, 1, 1, 64]`
//! becomes three axes `[4, 12, 64]` with `b` repeated along the middle one. The last merged axis
//! is the inner run, a plain loop over contiguous values (both operands whole, or one of them a
//! single value repeated) that the compiler vectorizes; the axes before it are walked by an
//! odometer that keeps each operand's offset (its stride 0 on an axis it broadcasts along).
//!
//! Each result is one IEEE operation on the two operands in their order (`a − b`, `a / b`), so
//! it is bit for bit what any other correct evaluation of the same operation gives. A result
//! the size of one operand can be written over that operand ([`binary_in_a`],
//! [`binary_in_b`]). Large results are split over the current rayon pool in chunks, by the
//! [`ThreadPolicy`]; the values do not depend on the split.

use rayon::prelude::*;

use crate::ThreadPolicy;

/// An element-wise operation of two float32 values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a − b`.
    Sub,
    /// `a · b`.
    Mul,
    /// `a / b`.
    Div,
}

impl BinaryOp {
    /// The operation on one pair of values.
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
        }
    }
}

/// The operation as a type, so that each inner loop is compiled for one operation.
trait Arith {
    fn f(a: f32, b: f32) -> f32;
}

macro_rules! arith {
    ($name:ident, $a:ident, $b:ident, $e:expr) => {
        struct $name;
        impl Arith for $name {
            #[inline(always)]
            fn f($a: f32, $b: f32) -> f32 {
                $e
            }
        }
    };
}

arith!(AddOp, a, b, a + b);
arith!(SubOp, a, b, a - b);
arith!(MulOp, a, b, a * b);
arith!(DivOp, a, b, a / b);

/// How two shapes broadcast to their result, with the result's axes merged (module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broadcast {
    /// The result's shape (rank: the larger of the two).
    shape: Vec<usize>,
    /// Values of the result, of `a` and of `b`.
    len: usize,
    a_len: usize,
    b_len: usize,
    /// The merged axes before the inner run, outermost first, with each operand's stride
    /// along them (0 where it broadcasts).
    outer: Vec<usize>,
    a_strides: Vec<usize>,
    b_strides: Vec<usize>,
    /// Length of the inner run, and whether each operand has a value per element of it (else
    /// one value for the whole run).
    inner: usize,
    a_whole: bool,
    b_whole: bool,
}

/// One merged axis: its size and whether `a`, `b` broadcast along it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Axis {
    size: usize,
    a_repeats: bool,
    b_repeats: bool,
}

impl Broadcast {
    /// The broadcast of shapes `a` and `b` (ONNX's rule: aligned on the right, each pair of
    /// sizes equal or one of them 1); `None` when they do not broadcast, or when a count of
    /// values overflows `usize`.
    pub fn new(a: &[usize], b: &[usize]) -> Option<Broadcast> {
        let rank = a.len().max(b.len());
        let size_of =
            |s: &[usize], axis: usize| (axis + s.len()).checked_sub(rank).map_or(1, |i| s[i]);
        let mut shape = Vec::with_capacity(rank);
        let mut axes: Vec<Axis> = Vec::with_capacity(rank);
        for axis in 0..rank {
            let (da, db) = (size_of(a, axis), size_of(b, axis));
            let size = match (da, db) {
                _ if da == db => da,
                (1, _) => db,
                (_, 1) => da,
                _ => return None,
            };
            shape.push(size);
            if size == 1 {
                continue;
            }
            let here = Axis {
                size,
                a_repeats: da == 1,
                b_repeats: db == 1,
            };
            match axes.last_mut() {
                Some(last)
                    if (last.a_repeats, last.b_repeats) == (here.a_repeats, here.b_repeats) =>
                {
                    // exact unless the result is empty (every size divides its count)
                    last.size = last.size.saturating_mul(size);
                }
                _ => axes.push(here),
            }
        }
        let len = volume(&shape)?;
        let inner_axis = axes.pop().unwrap_or(Axis {
            size: 1,
            a_repeats: false,
            b_repeats: false,
        });
        let strides = |repeats: fn(&Axis) -> bool| {
            let mut stride = if repeats(&inner_axis) {
                1
            } else {
                inner_axis.size
            };
            let mut out = vec![0; axes.len()];
            for (s, axis) in out.iter_mut().zip(&axes).rev() {
                if !repeats(axis) {
                    *s = stride;
                    stride = stride.saturating_mul(axis.size);
                }
            }
            out
        };
        Some(Broadcast {
            len,
            a_len: volume(a)?,
            b_len: volume(b)?,
            a_strides: strides(|x| x.a_repeats),
            b_strides: strides(|x| x.b_repeats),
            outer: axes.iter().map(|x| x.size).collect(),
            inner: inner_axis.size,
            a_whole: !inner_axis.a_repeats,
            b_whole: !inner_axis.b_repeats,
            shape,
        })
    }

    /// The result's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Values of the result.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the result has no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `a` has a value for every value of the result (none of its axes broadcasts),
    /// in the result's order: the result may be written over it ([`binary_in_a`]).
    pub fn covers_a(&self) -> bool {
        self.a_len == self.len
    }

    /// Whether the result may be written over `b` ([`binary_in_b`]).
    pub fn covers_b(&self) -> bool {
        self.b_len == self.len
    }

    /// The merged axes (outer ones, then the inner run): what the loops walk.
    pub fn merged_shape(&self) -> Vec<usize> {
        let mut s = self.outer.clone();
        s.push(self.inner);
        s
    }
}

/// The count of values of a shape (0 with an empty axis, whatever the others); `None` when it
/// overflows.
fn volume(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// Where an operand's values are read from.
#[derive(Clone, Copy)]
enum Source<'s> {
    /// Its own values.
    Values(&'s [f32]),
    /// The result's place, which holds it (the operation runs in place).
    Result,
}

impl<'s> Source<'s> {
    /// The part of an operand an inner run reads: from column `col` of the run at offset `off`,
    /// `n` values (or its one value, when it repeats along the run).
    #[inline(always)]
    fn run(self, off: usize, col: usize, n: usize, whole: bool) -> Run<'s> {
        match self {
            Source::Result => Run::InPlace,
            Source::Values(v) if whole => Run::Whole(&v[off + col..off + col + n]),
            Source::Values(v) => Run::Repeated(v[off]),
        }
    }
}

/// One inner run of an operand.
#[derive(Clone, Copy)]
enum Run<'s> {
    /// A value per element.
    Whole(&'s [f32]),
    /// One value for every element.
    Repeated(f32),
    /// The result's own values.
    InPlace,
}

/// `c = a ∘ b` with `a`, `b` of the shapes `layout` was made for and `c` of its result's.
///
/// # Panics
/// When the slices' lengths are not those of the shapes.
pub fn binary(
    op: BinaryOp,
    layout: &Broadcast,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    threads: &ThreadPolicy,
) {
    assert_eq!(a.len(), layout.a_len, "a's values");
    assert_eq!(b.len(), layout.b_len, "b's values");
    run(op, layout, Source::Values(a), Source::Values(b), c, threads);
}

/// `a = a ∘ b`, for a layout that [covers `a`](Broadcast::covers_a).
///
/// # Panics
/// When it does not, or the slices' lengths are not those of the shapes.
pub fn binary_in_a(
    op: BinaryOp,
    layout: &Broadcast,
    a: &mut [f32],
    b: &[f32],
    threads: &ThreadPolicy,
) {
    assert!(layout.covers_a(), "the result is larger than a");
    assert_eq!(b.len(), layout.b_len, "b's values");
    run(op, layout, Source::Result, Source::Values(b), a, threads);
}

/// `b = a ∘ b`, for a layout that [covers `b`](Broadcast::covers_b).
///
/// # Panics
/// When it does not, or the slices' lengths are not those of the shapes.
pub fn binary_in_b(
    op: BinaryOp,
    layout: &Broadcast,
    a: &[f32],
    b: &mut [f32],
    threads: &ThreadPolicy,
) {
    assert!(layout.covers_b(), "the result is larger than b");
    assert_eq!(a.len(), layout.a_len, "a's values");
    run(op, layout, Source::Values(a), Source::Result, b, threads);
}

fn run(
    op: BinaryOp,
    layout: &Broadcast,
    a: Source,
    b: Source,
    c: &mut [f32],
    threads: &ThreadPolicy,
) {
    assert_eq!(c.len(), layout.len, "the result's values");
    match op {
        BinaryOp::Add => split::<AddOp>(layout, a, b, c, threads),
        BinaryOp::Sub => split::<SubOp>(layout, a, b, c, threads),
        BinaryOp::Mul => split::<MulOp>(layout, a, b, c, threads),
        BinaryOp::Div => split::<DivOp>(layout, a, b, c, threads),
    }
}

/// The result in chunks over the pool when the policy spreads it, else in one range.
fn split<O: Arith>(l: &Broadcast, a: Source, b: Source, c: &mut [f32], threads: &ThreadPolicy) {
    if threads.spreads_values(c.len()) {
        let chunk = threads.elementwise_chunk();
        c.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, part)| range::<O>(l, a, b, part, i * chunk));
    } else {
        range::<O>(l, a, b, c, 0);
    }
}

/// The values of the result from flat index `start` on, `c.len()` of them, into `c`.
fn range<O: Arith>(l: &Broadcast, a: Source, b: Source, c: &mut [f32], start: usize) {
    if c.is_empty() {
        return;
    }
    let mut row = start / l.inner;
    let mut col = start % l.inner;
    // The odometer at `row`, and each operand's offset there.
    let mut at = vec![0; l.outer.len()];
    let (mut a_off, mut b_off) = (0, 0);
    for (i, &size) in l.outer.iter().enumerate().rev() {
        at[i] = row % size;
        row /= size;
        a_off += at[i] * l.a_strides[i];
        b_off += at[i] * l.b_strides[i];
    }
    let mut done = 0;
    while done < c.len() {
        let n = (l.inner - col).min(c.len() - done);
        let ra = a.run(a_off, col, n, l.a_whole);
        let rb = b.run(b_off, col, n, l.b_whole);
        inner::<O>(&mut c[done..done + n], ra, rb);
        done += n;
        col = 0;
        for i in (0..l.outer.len()).rev() {
            at[i] += 1;
            a_off += l.a_strides[i];
            b_off += l.b_strides[i];
            if at[i] < l.outer[i] {
                break;
            }
            at[i] = 0;
            a_off -= l.a_strides[i] * l.outer[i];
            b_off -= l.b_strides[i] * l.outer[i];
        }
    }
}

/// One inner run: each arm a plain loop over contiguous values.
#[inline(always)]
fn inner<O: Arith>(c: &mut [f32], a: Run, b: Run) {
    match (a, b) {
        (Run::Whole(a), Run::Whole(b)) => {
            for ((c, &x), &y) in c.iter_mut().zip(a).zip(b) {
                *c = O::f(x, y);
            }
        }
        (Run::Whole(a), Run::Repeated(y)) => {
            for (c, &x) in c.iter_mut().zip(a) {
                *c = O::f(x, y);
            }
        }
        (Run::Repeated(x), Run::Whole(b)) => {
            for (c, &y) in c.iter_mut().zip(b) {
                *c = O::f(x, y);
            }
        }
        (Run::Repeated(x), Run::Repeated(y)) => c.fill(O::f(x, y)),
        (Run::InPlace, Run::Whole(b)) => {
            for (c, &y) in c.iter_mut().zip(b) {
                *c = O::f(*c, y);
            }
        }
        (Run::InPlace, Run::Repeated(y)) => {
            for c in c.iter_mut() {
                *c = O::f(*c, y);
            }
        }
        (Run::Whole(a), Run::InPlace) => {
            for (c, &x) in c.iter_mut().zip(a) {
                *c = O::f(x, *c);
            }
        }
        (Run::Repeated(x), Run::InPlace) => {
            for c in c.iter_mut() {
                *c = O::f(x, *c);
            }
        }
        (Run::InPlace, Run::InPlace) => {
            for c in c.iter_mut() {
                *c = O::f(*c, *c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The result by the definition: every index of the result mapped to each operand's.
    fn naive(op: BinaryOp, a: &[f32], sa: &[usize], b: &[f32], sb: &[usize]) -> Vec<f32> {
        let l = Broadcast::new(sa, sb).unwrap();
        let shape = l.shape().to_vec();
        let index = |s: &[usize], coords: &[usize]| {
            let skip = shape.len() - s.len();
            s.iter()
                .zip(&coords[skip..])
                .fold(0, |acc, (&d, &i)| acc * d + if d == 1 { 0 } else { i })
        };
        let mut out = Vec::with_capacity(l.len());
        let mut coords = vec![0; shape.len()];
        for _ in 0..l.len() {
            out.push(op.apply(a[index(sa, &coords)], b[index(sb, &coords)]));
            for i in (0..shape.len()).rev() {
                coords[i] += 1;
                if coords[i] < shape[i] {
                    break;
                }
                coords[i] = 0;
            }
        }
        out
    }

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-40];
        (0..n as u64)
            .map(|i| {
                let h = (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed;
                if h.is_multiple_of(13) {
                    special[(h / 13) as usize % special.len()]
                } else {
                    ((h >> 11) % 2001) as f32 / 250.0 - 4.0
                }
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    const OPS: [BinaryOp; 4] = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div];

    /// Every way of computing it (out of place, over either operand) against the naive one,
    /// on one thread and split in chunks of 16 values over two.
    fn check(op: BinaryOp, sa: &[usize], sb: &[usize], seed: u64) {
        let l = Broadcast::new(sa, sb).unwrap();
        let a = values(sa.iter().product(), seed);
        let b = values(sb.iter().product(), seed ^ 0x55);
        let want = bits(&naive(op, &a, sa, &b, sb));
        let policies = [
            ThreadPolicy::default(),
            ThreadPolicy::default().spreading_from(1, 16),
        ];
        for threads in &policies {
            crate::testing::pool(2).install(|| {
                let mut c = vec![0.0; l.len()];
                binary(op, &l, &a, &b, &mut c, threads);
                assert_eq!(bits(&c), want, "{op:?} {sa:?} {sb:?}");
                if l.covers_a() {
                    let mut c = a.clone();
                    binary_in_a(op, &l, &mut c, &b, threads);
                    assert_eq!(bits(&c), want, "{op:?} in a {sa:?} {sb:?}");
                }
                if l.covers_b() {
                    let mut c = b.clone();
                    binary_in_b(op, &l, &a, &mut c, threads);
                    assert_eq!(bits(&c), want, "{op:?} in b {sa:?} {sb:?}");
                }
            });
        }
    }

    #[test]
    fn the_rope_product_merges_to_three_axes() {
        let l = Broadcast::new(&[4, 12, 1, 64], &[4, 1, 1, 64]).unwrap();
        assert_eq!(l.shape(), [4, 12, 1, 64]);
        assert_eq!(l.merged_shape(), [4, 12, 64]);
        assert_eq!(
            (l.a_strides.as_slice(), l.b_strides.as_slice()),
            (&[768, 64][..], &[64, 0][..])
        );
        assert!(l.covers_a() && !l.covers_b());
        check(BinaryOp::Mul, &[4, 12, 1, 64], &[4, 1, 1, 64], 1);
    }

    #[test]
    fn shapes_that_do_not_broadcast_are_refused() {
        assert!(Broadcast::new(&[2, 3], &[3, 2]).is_none());
        assert!(Broadcast::new(&[0], &[2]).is_none());
        let huge = usize::MAX / 2;
        assert!(Broadcast::new(&[huge, 1], &[1, 3]).is_none());
        let l = Broadcast::new(&[huge, 1, 0], &[1, huge, 1]).unwrap();
        assert!(l.is_empty());
        let l = Broadcast::new(&[0, 3], &[1, 3]).unwrap();
        assert_eq!((l.shape(), l.len()), (&[0, 3][..], 0));
    }

    #[test]
    fn scalars_empty_results_and_rank_differences() {
        for op in OPS {
            for (sa, sb) in [
                (&[][..], &[][..]),
                (&[], &[5]),
                (&[7], &[]),
                (&[1, 1], &[1]),
                (&[0, 4], &[4]),
                (&[3, 0], &[1, 1]),
                (&[3], &[2, 1, 3]),
                (&[2, 1, 3], &[4, 1]),
                (&[5, 1], &[1, 6]),
            ] {
                check(op, sa, sb, 7);
                check(op, sb, sa, 8);
            }
        }
    }

    /// Pairs of shapes that broadcast: a result shape, each operand's axes kept or made 1,
    /// and a few leading axes dropped.
    fn shapes() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
        (1usize..=5)
            .prop_flat_map(|rank| {
                (
                    prop::collection::vec(0usize..=6, rank),
                    prop::collection::vec(0u8..4, rank),
                    0..=rank,
                    0..=rank,
                )
            })
            .prop_map(|(shape, pattern, drop_a, drop_b)| {
                let a: Vec<usize> = shape
                    .iter()
                    .zip(&pattern)
                    .map(|(&d, &p)| if p & 1 == 1 { 1 } else { d })
                    .collect();
                let b: Vec<usize> = shape
                    .iter()
                    .zip(&pattern)
                    .map(|(&d, &p)| if p & 2 == 2 { 1 } else { d })
                    .collect();
                (
                    a[drop_a.min(a.len())..].to_vec(),
                    b[drop_b.min(b.len())..].to_vec(),
                )
            })
    }

    proptest! {
        #[test]
        fn every_broadcast_equals_the_definition(
            (sa, sb) in shapes(),
            op in prop::sample::select(OPS.to_vec()),
            seed in any::<u64>(),
        ) {
            check(op, &sa, &sb, seed);
        }
    }
}
