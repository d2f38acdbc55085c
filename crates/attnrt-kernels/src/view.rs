//! Strided 4-D views over caller-owned buffers, validated on construction and again at the
//! kernel boundary (the fields are public, so a view may be built without a constructor).

use crate::error::KernelError;

/// Strided read-only view of a 4-D tensor, dims = `[batch, heads, seq, head_dim]`, strides in
/// elements. A stride may be 0 to broadcast an axis. Strides must not be negative (a view has no
/// base offset, so a negative stride would index before `data`).
pub struct View4<'a, T = f32> {
    /// The elements; index `[a, b, c, d]` lives at `Σ idx·stride`.
    pub data: &'a [T],
    /// Extent of each axis.
    pub dims: [usize; 4],
    /// Distance in elements between consecutive indices of each axis.
    pub strides: [isize; 4],
}

// Manual impls: deriving would require `T: Clone`/`T: Debug` and print the whole buffer.
impl<T> Clone for View4<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for View4<'_, T> {}
impl<T> std::fmt::Debug for View4<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View4")
            .field("len", &self.data.len())
            .field("dims", &self.dims)
            .field("strides", &self.strides)
            .finish()
    }
}

impl<'a, T> View4<'a, T> {
    /// A view with explicit strides; fails if any index would fall outside `data`.
    pub fn new(data: &'a [T], dims: [usize; 4], strides: [isize; 4]) -> Result<Self, KernelError> {
        check_extent("view", data.len(), &dims, &strides)?;
        Ok(View4 {
            data,
            dims,
            strides,
        })
    }

    /// A dense row-major `[B, H, L, D]` view.
    pub fn contiguous(data: &'a [T], dims: [usize; 4]) -> Result<Self, KernelError> {
        let strides = contiguous_strides("view", &dims)?;
        Self::new(data, dims, strides)
    }

    /// A dense 3-D `[batch, seq, heads·head_dim]` buffer (the ONNX `Attention` 3-D layout) seen
    /// as `[batch, heads, seq, head_dim]` without copying.
    pub fn from_bshd(
        data: &'a [T],
        batch: usize,
        seq: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<Self, KernelError> {
        let strides = bshd_strides("view", batch, seq, heads, head_dim)?;
        Self::new(data, [batch, heads, seq, head_dim], strides)
    }

    /// Re-checks the invariants the constructors establish (needed because the fields are public).
    pub fn validate(&self, tensor: &'static str) -> Result<(), KernelError> {
        check_extent(tensor, self.data.len(), &self.dims, &self.strides)
    }

    /// Number of logical elements (product of dims).
    pub fn num_elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// Element at `idx` (bounds-checked by the slice; panics only on an unvalidated view).
    pub(crate) fn at(&self, idx: [usize; 4]) -> &T {
        &self.data[offset_of(&self.strides, &self.dims, idx)]
    }
}

/// Strided mutable view of a 4-D f32 tensor (the kernel's output). Besides the bounds check, the
/// constructors reject strides under which two indices share an element, because the kernel
/// writes disjoint parts from several threads.
pub struct ViewMut4<'a> {
    /// The elements; index `[a, b, c, d]` lives at `Σ idx·stride`.
    pub data: &'a mut [f32],
    /// Extent of each axis.
    pub dims: [usize; 4],
    /// Distance in elements between consecutive indices of each axis (≥ 1 for axes longer than 1).
    pub strides: [isize; 4],
}

impl std::fmt::Debug for ViewMut4<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewMut4")
            .field("len", &self.data.len())
            .field("dims", &self.dims)
            .field("strides", &self.strides)
            .finish()
    }
}

impl<'a> ViewMut4<'a> {
    /// A view with explicit strides; fails if an index falls outside `data` or two indices alias.
    pub fn new(
        data: &'a mut [f32],
        dims: [usize; 4],
        strides: [isize; 4],
    ) -> Result<Self, KernelError> {
        check_extent("out", data.len(), &dims, &strides)?;
        check_no_overlap("out", &dims, &strides)?;
        Ok(ViewMut4 {
            data,
            dims,
            strides,
        })
    }

    /// A dense row-major `[B, H, L, D]` view.
    pub fn contiguous(data: &'a mut [f32], dims: [usize; 4]) -> Result<Self, KernelError> {
        let strides = contiguous_strides("out", &dims)?;
        Self::new(data, dims, strides)
    }

    /// A dense 3-D `[batch, seq, heads·head_dim]` buffer seen as `[batch, heads, seq, head_dim]`.
    pub fn from_bshd(
        data: &'a mut [f32],
        batch: usize,
        seq: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<Self, KernelError> {
        let strides = bshd_strides("out", batch, seq, heads, head_dim)?;
        Self::new(data, [batch, heads, seq, head_dim], strides)
    }

    /// Re-checks bounds and the no-aliasing rule (the fields are public).
    pub fn validate(&self, tensor: &'static str) -> Result<(), KernelError> {
        check_extent(tensor, self.data.len(), &self.dims, &self.strides)?;
        check_no_overlap(tensor, &self.dims, &self.strides)
    }

    /// Number of logical elements (product of dims).
    pub fn num_elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// Mutable element at `idx` (bounds-checked by the slice).
    pub(crate) fn at_mut(&mut self, idx: [usize; 4]) -> &mut f32 {
        let off = offset_of(&self.strides, &self.dims, idx);
        &mut self.data[off]
    }
}

/// Offset of `idx`; axes of extent 1 contribute nothing whatever their stride.
pub(crate) fn offset_of(strides: &[isize; 4], dims: &[usize; 4], idx: [usize; 4]) -> usize {
    let mut off = 0isize;
    for a in 0..4 {
        if dims[a] > 1 {
            off += idx[a] as isize * strides[a];
        }
    }
    off as usize
}

/// Strides with the ones of length-1 axes replaced by 0, so the kernel may ignore extents.
pub(crate) fn effective_strides(dims: &[usize; 4], strides: &[isize; 4]) -> [isize; 4] {
    let mut s = *strides;
    for a in 0..4 {
        if dims[a] <= 1 {
            s[a] = 0;
        }
    }
    s
}

fn invalid(tensor: &'static str, reason: String) -> KernelError {
    KernelError::InvalidView { tensor, reason }
}

fn contiguous_strides(tensor: &'static str, dims: &[usize; 4]) -> Result<[isize; 4], KernelError> {
    let mut strides = [0isize; 4];
    let mut acc: usize = 1;
    for a in (0..4).rev() {
        strides[a] = isize::try_from(acc)
            .map_err(|_| invalid(tensor, format!("dims {dims:?} overflow the address space")))?;
        acc = acc
            .checked_mul(dims[a])
            .ok_or_else(|| invalid(tensor, format!("dims {dims:?} overflow the address space")))?;
    }
    Ok(strides)
}

fn bshd_strides(
    tensor: &'static str,
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
) -> Result<[isize; 4], KernelError> {
    let too_big = || {
        invalid(
            tensor,
            format!("3-D shape [{batch}, {seq}, {heads}x{head_dim}] overflows"),
        )
    };
    let hidden = heads.checked_mul(head_dim).ok_or_else(too_big)?;
    let per_batch = seq.checked_mul(hidden).ok_or_else(too_big)?;
    let _total = batch.checked_mul(per_batch).ok_or_else(too_big)?;
    let s = |x: usize| isize::try_from(x).map_err(|_| too_big());
    Ok([s(per_batch)?, s(head_dim)?, s(hidden)?, 1])
}

/// Every index of a non-empty view must land inside `len`.
fn check_extent(
    tensor: &'static str,
    len: usize,
    dims: &[usize; 4],
    strides: &[isize; 4],
) -> Result<(), KernelError> {
    if dims.contains(&0) {
        return Ok(());
    }
    let mut max_off: usize = 0;
    for a in 0..4 {
        if dims[a] == 1 {
            continue;
        }
        if strides[a] < 0 {
            return Err(invalid(
                tensor,
                format!("negative stride {} on axis {a} (dims {dims:?}, strides {strides:?}); a view has no base offset", strides[a]),
            ));
        }
        let span = (strides[a] as usize)
            .checked_mul(dims[a] - 1)
            .and_then(|x| max_off.checked_add(x))
            .ok_or_else(|| {
                invalid(
                    tensor,
                    format!("dims {dims:?} with strides {strides:?} overflow"),
                )
            })?;
        max_off = span;
    }
    if max_off >= len {
        return Err(invalid(
            tensor,
            format!(
                "dims {dims:?} with strides {strides:?} reach element {max_off}, but the buffer holds {len}"
            ),
        ));
    }
    Ok(())
}

/// Sufficient condition for an injective index→offset map: sorted by stride, each stride exceeds
/// the span covered by all smaller axes.
fn check_no_overlap(
    tensor: &'static str,
    dims: &[usize; 4],
    strides: &[isize; 4],
) -> Result<(), KernelError> {
    if dims.contains(&0) {
        return Ok(());
    }
    let mut axes: Vec<usize> = (0..4).filter(|&a| dims[a] > 1).collect();
    axes.sort_by_key(|&a| strides[a]);
    let mut span: isize = 0; // largest offset reachable by the axes seen so far
    for &a in &axes {
        if strides[a] <= span {
            return Err(invalid(
                tensor,
                format!("dims {dims:?} with strides {strides:?} make distinct indices share an element (axis {a})"),
            ));
        }
        span += strides[a] * (dims[a] as isize - 1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bshd_strides_match_the_3d_layout() {
        let data = vec![0.0f32; 2 * 5 * 3 * 4];
        let v = View4::from_bshd(&data, 2, 5, 3, 4).unwrap();
        assert_eq!(v.dims, [2, 3, 5, 4]);
        assert_eq!(v.strides, [60, 4, 12, 1]);
        assert!(View4::from_bshd(&data[1..], 2, 5, 3, 4).is_err());
    }

    #[test]
    fn out_of_bounds_and_negative_strides_are_rejected() {
        let data = vec![0.0f32; 10];
        assert!(View4::new(&data, [1, 1, 2, 5], [0, 0, 5, 1]).is_ok());
        assert!(View4::new(&data, [1, 1, 2, 6], [0, 0, 5, 1]).is_err());
        assert!(View4::new(&data, [1, 1, 2, 5], [0, 0, -5, 1]).is_err());
        // Broadcast (stride 0) and empty views are fine.
        assert!(View4::new(&data, [7, 1, 1, 10], [0, 0, 0, 1]).is_ok());
        assert!(View4::new(&data[..0], [1, 0, 3, 3], [9, 9, 9, 9]).is_ok());
    }

    #[test]
    fn aliasing_outputs_are_rejected() {
        let mut data = vec![0.0f32; 16];
        assert!(ViewMut4::new(&mut data, [1, 1, 4, 4], [0, 0, 4, 1]).is_ok());
        assert!(ViewMut4::new(&mut data, [1, 1, 4, 4], [0, 0, 0, 1]).is_err());
        assert!(ViewMut4::new(&mut data, [1, 1, 4, 4], [0, 0, 3, 1]).is_err());
        // Transposed but injective.
        assert!(ViewMut4::new(&mut data, [1, 1, 4, 4], [0, 0, 1, 4]).is_ok());
    }
}
