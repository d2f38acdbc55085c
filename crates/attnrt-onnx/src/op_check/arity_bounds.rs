//! The input and output counts one operator schema version allows: the type of the rows of
//! the generated `arity_table.rs`, and what `arity.rs` checks nodes against.

/// Marks an input or output list without an upper bound (a variadic parameter).
pub(super) const N: usize = usize::MAX;

/// How many inputs and outputs a schema version allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Arity {
    /// The fewest inputs (the required ones, listed first by every schema).
    pub(super) min_in: usize,
    /// The most inputs ([`N`]: variadic).
    pub(super) max_in: usize,
    /// The fewest outputs.
    pub(super) min_out: usize,
    /// The most outputs ([`N`]: variadic).
    pub(super) max_out: usize,
}

impl Arity {
    pub(super) const fn new(min_in: usize, max_in: usize, min_out: usize, max_out: usize) -> Self {
        Arity {
            min_in,
            max_in,
            min_out,
            max_out,
        }
    }
}
