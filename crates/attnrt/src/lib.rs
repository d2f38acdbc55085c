//! attnrt: run ONNX models exported from PyTorch on CPUs with their attention fused.
//!
//! This crate is the user-facing layer over attnrt's parts: [`attnrt_onnx`] (load and save
//! models), [`attnrt_fusion`] (find and fuse attention blocks, explain every candidate) and
//! [`attnrt_runtime`] (sessions on tract with attnrt's attention kernel). [`generate`] runs
//! decoders exported with their key/value cache, token by token.

#![warn(missing_docs)]

pub mod generate;
pub mod harness;

pub use attnrt_fusion as fusion;
pub use attnrt_onnx as onnx;
pub use attnrt_runtime as runtime;
