//! ONNX Runtime's contrib ops on attnrt's kernels: the files ONNX Runtime's own tools write
//! (onnxruntime-genai's model builder, the transformer optimizer, `MatMulNBitsQuantizer`). tract-onnx
//! keys its parsers by op type alone, so a parser here that shares an op type with an ONNX
//! operator (`Attention`) reads the node's domain before anything else.
