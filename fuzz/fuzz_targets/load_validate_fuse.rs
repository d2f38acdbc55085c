//! libFuzzer target: one input is the bytes of a model file; it goes through decoding with
//! limits, tensor checks, validation, the static allocation check, fusion, and validation of
//! the fused model. The body is shared with the stable harness `tests/tests/hostile_fuzz.rs`.

#![no_main]

#[path = "../../tests/src/hostile_fuzz.rs"]
mod hostile_fuzz;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // An empty folder: external data references must all fail cleanly.
    static EMPTY: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let dir = EMPTY.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("attnrt-fuzz-empty-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("create the empty folder");
        d
    });
    hostile_fuzz::fuzz_one(data, dir);
});
