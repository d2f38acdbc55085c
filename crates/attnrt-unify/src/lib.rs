//! No code: this crate's dependencies pin one feature set for the packages the workspace's
//! crates share (see its Cargo.toml), so that each build selection compiles tract once.
