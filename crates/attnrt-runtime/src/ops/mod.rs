//! attnrt's execution ops, by family. Each op is one file: the op, its planned name
//! (`OP_NAME`) and an `OnnxParser` static per ONNX op type it parses, registered by one entry of
//! `registry.rs` (`OPS`).
//!
//! - [`microsoft`]: ONNX Runtime's contrib ops, those of the `com.microsoft` domain and those ONNX
//!   Runtime registers in the default domain (the files its tools write carry both).

pub(crate) mod microsoft;
