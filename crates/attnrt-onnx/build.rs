//! Compiles `proto/onnx.proto` with protox (pure Rust), so no system `protoc` is needed.

use std::path::PathBuf;

fn main() {
    let proto_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let proto_file = proto_dir.join("onnx.proto");
    println!("cargo:rerun-if-changed={}", proto_file.display());
    println!("cargo:rerun-if-changed=build.rs");
    let descriptors = protox::compile([&proto_file], [&proto_dir])
        .unwrap_or_else(|e| panic!("compiling {}: {e}", proto_file.display()));
    prost_build::Config::new()
        // Tensor data as `bytes::Bytes`: a model decoded from a buffer (or a mapped file)
        // shares it, and a clone of a model (fusion's working copy) shares it too.
        .bytes([".onnx.TensorProto.raw_data"])
        .compile_fds(descriptors)
        .unwrap_or_else(|e| panic!("generating Rust for {}: {e}", proto_file.display()));
}
