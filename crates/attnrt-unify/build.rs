// Empty: Cargo resolves a package's build-dependencies only when it has a build script, and
// this crate's build-dependencies pin the features that build scripts and proc macros see.
fn main() {}
