//! A generator for attnrt's corpus of broken and hostile models (issue 5).
//!
//! Every case is built here from code, not kept as a hand-edited binary, so what makes it
//! hostile is visible and it cannot drift from the schema. [`write_corpus`] writes each case
//! into its own folder (`<dir>/<case>/model.onnx`, plus the external data, links or input
//! files it needs) and says where attnrt must refuse it and what the one error line must say.
//!
//! This file depends on `attnrt_onnx`, `attnrt_testkit` and `std` only, so that both the
//! library-level tests (`tests/tests/hostile.rs`) and the CLI-level tests
//! (`crates/attnrt-cli/tests/hostile.rs`) include it with `#[path]`.

#![allow(dead_code)] // each includer uses part of it

use std::path::{Path, PathBuf};

use attnrt_onnx::attr::{make_int, make_ints};
use attnrt_onnx::proto::{
    attribute_proto::AttributeType, tensor_proto::DataLocation, type_proto, AttributeProto,
    FunctionProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use attnrt_onnx::Message;
use attnrt_testkit::{float_value, node, node_with_attrs, npy_bytes, tensor_f32, tensor_i64};

/// Where attnrt must refuse a case: the first step of `load → validate → allocation check
/// → inputs` that fails. Every earlier step must succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `attnrt_onnx::load_model` (decoding, limits, tensors, external data).
    Load,
    /// `attnrt_onnx::validate::validate_model_with` (structure).
    Validate,
    /// `attnrt_onnx::check_static_allocation` (sizes fixed by the file), which `load_model`
    /// runs last: the error comes from loading, after every tensor was checked.
    Allocation,
    /// `attnrt_runtime::prepare_inputs` (`--input` / `--input-npz` files).
    Inputs,
}

/// One broken or hostile input and the refusal expected for it.
#[derive(Debug, Clone)]
pub struct HostileCase {
    /// Short identifier, also the case's folder name.
    pub name: &'static str,
    /// What is wrong with it, for the closing table of issue 5.
    pub what: &'static str,
    /// The model file.
    pub model: PathBuf,
    /// Where attnrt must refuse it.
    pub stage: Stage,
    /// Substrings the error line must contain (the tensor/node/file it is about, and why).
    pub expect: Vec<String>,
    /// Extra arguments of `attnrt run` (input files, lowered limits).
    pub run_args: Vec<String>,
    /// Whether the case applies to the `attnrt` binary (false when it needs a limit the CLI
    /// has no flag for).
    pub cli: bool,
    /// Limits lowered for this case (the CLI gets the matching flags in `run_args`).
    pub limits: attnrt_onnx::Limits,
}

impl HostileCase {
    /// Whether `attnrt fuse` must refuse the case too (it loads and validates, but neither
    /// allocates tensors nor reads inputs).
    pub fn fuse_fails(&self) -> bool {
        matches!(self.stage, Stage::Load | Stage::Validate)
    }
}

// ---------------------------------------------------------------------------------------------
// Small builders.

/// A model (IR 8, opset 17) around `graph`.
pub fn model(graph: GraphProto) -> ModelProto {
    ModelProto {
        producer_name: "attnrt-hostile".into(),
        ..attnrt_testkit::model(graph, 17)
    }
}

/// The valid baseline: `y = Relu(x + w)`, x and y float [2, 4], w an initializer.
pub fn baseline() -> ModelProto {
    model(GraphProto {
        name: "baseline".into(),
        node: vec![
            node("add", "Add", &["x", "w"], &["s"]),
            node("relu", "Relu", &["s"], &["y"]),
        ],
        initializer: vec![tensor_f32("w", &[4], &[0.5, -0.5, 1.0, -1.0])],
        input: vec![float_value("x", &[2, 4])],
        output: vec![float_value("y", &[2, 4])],
        ..Default::default()
    })
}

/// A chain of `n` nodes (`Relu`, with a `Softmax` every 1000th) from `x` to `y`: a big but
/// valid graph for the scale test.
pub fn chain_model(n: usize) -> ModelProto {
    let mut nodes = Vec::with_capacity(n);
    for i in 0..n {
        let (input, output) = attnrt_testkit::chain_link(i, n);
        let op = if i % 1000 == 999 { "Softmax" } else { "Relu" };
        nodes.push(node(&format!("n{i}"), op, &[&input], &[&output]));
    }
    model(GraphProto {
        name: "chain".into(),
        node: nodes,
        input: vec![float_value("x", &[2, 4])],
        output: vec![float_value("y", &[2, 4])],
        ..Default::default()
    })
}

/// Appends a length-delimited field (`tag`, then the length, then `bytes`) to `out`.
fn push_len_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    varint(out, ((field as u64) << 3) | 2); // wire type 2: length-delimited
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A model whose main graph holds an `If` (or `Loop`, alternating) whose body holds another,
/// `depth` levels deep. Encoded from the inside out without recursion, so that building it
/// needs no deep stack whatever `depth` is (protobuf fields may come in any order, so the
/// nested field is appended after the others).
pub fn nested_subgraphs_bytes(depth: usize) -> Vec<u8> {
    // The innermost body: y0 = Identity(x).
    let mut graph = GraphProto {
        name: "level0".into(),
        node: vec![node("leaf", "Identity", &["x"], &["y0"])],
        output: vec![float_value("y0", &[2, 4])],
        ..Default::default()
    }
    .encode_to_vec();
    for level in 1..=depth {
        let (op, attr) = if level % 2 == 1 {
            ("If", "then_branch")
        } else {
            ("Loop", "body")
        };
        let mut attribute = AttributeProto {
            name: attr.into(),
            r#type: AttributeType::Graph as i32,
            ..Default::default()
        }
        .encode_to_vec();
        push_len_field(&mut attribute, 6, &graph); // AttributeProto.g = 6
        let out = format!("y{level}");
        let mut n = node(
            &format!("{}_{level}", op.to_lowercase()),
            op,
            &["cond"],
            &[&out],
        )
        .encode_to_vec();
        push_len_field(&mut n, 5, &attribute); // NodeProto.attribute = 5
        let mut g = GraphProto {
            name: format!("level{level}"),
            output: vec![float_value(&out, &[2, 4])],
            ..Default::default()
        }
        .encode_to_vec();
        push_len_field(&mut g, 1, &n); // GraphProto.node = 1
        graph = g;
    }
    // The main graph's inputs, read by the bodies from the enclosing scope.
    let inputs = GraphProto {
        input: vec![
            float_value("x", &[2, 4]),
            ValueInfoProto {
                name: "cond".into(),
                r#type: Some(TypeProto {
                    value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                        elem_type: 9, // bool
                        shape: Some(TensorShapeProto { dim: vec![] }),
                    })),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ],
        ..Default::default()
    }
    .encode_to_vec();
    graph.extend_from_slice(&inputs);
    let mut m = ModelProto {
        graph: None,
        ..model(GraphProto::default())
    }
    .encode_to_vec();
    push_len_field(&mut m, 7, &graph); // ModelProto.graph = 7
    m
}

/// Model-local functions `f0 … f{levels-1}` in domain `local`, each calling the next twice:
/// inlining `f0` would make 2^levels nodes.
pub fn exploding_functions(levels: usize) -> ModelProto {
    let mut m = baseline();
    m.opset_import.push(OperatorSetIdProto {
        domain: "local".into(),
        version: 1,
    });
    for i in 0..levels {
        let node_ = |k: usize| {
            let (inp, out) = if k == 0 { ("a", "b") } else { ("b", "c") };
            if i + 1 < levels {
                NodeProto {
                    name: format!("f{i}_call{k}"),
                    op_type: format!("f{}", i + 1),
                    domain: "local".into(),
                    input: vec![inp.into()],
                    output: vec![out.into()],
                    ..Default::default()
                }
            } else {
                node(&format!("f{i}_relu{k}"), "Relu", &[inp], &[out])
            }
        };
        m.functions.push(FunctionProto {
            name: format!("f{i}"),
            domain: "local".into(),
            input: vec!["a".into()],
            output: vec!["c".into()],
            node: vec![node_(0), node_(1)],
            opset_import: vec![
                OperatorSetIdProto {
                    domain: String::new(),
                    version: 17,
                },
                OperatorSetIdProto {
                    domain: "local".into(),
                    version: 1,
                },
            ],
            ..Default::default()
        });
    }
    let g = m.graph.as_mut().unwrap();
    g.node.push(NodeProto {
        name: "call_f0".into(),
        op_type: "f0".into(),
        domain: "local".into(),
        input: vec!["y".into()],
        output: vec!["z".into()],
        ..Default::default()
    });
    g.output = vec![float_value("z", &[2, 4])];
    m
}

/// CRC-32 (IEEE), as zip needs it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A `.npz` (a zip of stored, uncompressed `.npy` entries) with the given `name.npy` entries.
pub fn npz_bytes(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    let le16 = |v: &mut Vec<u8>, x: u16| v.extend_from_slice(&x.to_le_bytes());
    let le32 = |v: &mut Vec<u8>, x: u32| v.extend_from_slice(&x.to_le_bytes());
    for (name, data) in entries {
        let file_name = format!("{name}.npy");
        let crc = crc32(data);
        let offset = out.len() as u32;
        le32(&mut out, 0x0403_4b50);
        for x in [20u16, 0, 0, 0, 0x21] {
            le16(&mut out, x); // version, flags, stored, time, date (1980-01-01)
        }
        le32(&mut out, crc);
        le32(&mut out, data.len() as u32);
        le32(&mut out, data.len() as u32);
        le16(&mut out, file_name.len() as u16);
        le16(&mut out, 0);
        out.extend_from_slice(file_name.as_bytes());
        out.extend_from_slice(data);

        le32(&mut central, 0x0201_4b50);
        for x in [20u16, 20, 0, 0, 0, 0x21] {
            le16(&mut central, x);
        }
        le32(&mut central, crc);
        le32(&mut central, data.len() as u32);
        le32(&mut central, data.len() as u32);
        le16(&mut central, file_name.len() as u16);
        for x in [0u16, 0, 0, 0] {
            le16(&mut central, x); // extra, comment, disk, internal attributes
        }
        le32(&mut central, 0);
        le32(&mut central, offset);
        central.extend_from_slice(file_name.as_bytes());
    }
    let cd_offset = out.len() as u32;
    out.extend_from_slice(&central);
    le32(&mut out, 0x0605_4b50);
    for x in [0u16, 0, entries.len() as u16, entries.len() as u16] {
        le16(&mut out, x);
    }
    le32(&mut out, central.len() as u32);
    le32(&mut out, cd_offset);
    le16(&mut out, 0);
    out
}

/// `n` bytes from a fixed-seed xorshift generator (the corpus must not change between runs).
pub fn pseudo_random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

fn f32_bytes(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// An initializer `w` of float [4] stored externally at `location`.
fn external_initializer(location: &str, offset: u64, length: u64) -> TensorProto {
    let entry = |k: &str, v: String| StringStringEntryProto {
        key: k.into(),
        value: v,
    };
    TensorProto {
        name: "w".into(),
        dims: vec![4],
        data_type: 1,
        data_location: DataLocation::External as i32,
        external_data: vec![
            entry("location", location.into()),
            entry("offset", offset.to_string()),
            entry("length", length.to_string()),
        ],
        ..Default::default()
    }
}

fn with_initializer(t: TensorProto) -> ModelProto {
    let mut m = baseline();
    m.graph.as_mut().unwrap().initializer = vec![t];
    m
}

// ---------------------------------------------------------------------------------------------
// The corpus.

struct Builder {
    root: PathBuf,
    cases: Vec<HostileCase>,
}

impl Builder {
    /// Creates the case folder and returns the model path inside it.
    fn folder(&self, name: &str) -> PathBuf {
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).expect("create case folder");
        dir.join("model.onnx")
    }

    fn add_bytes(
        &mut self,
        name: &'static str,
        what: &'static str,
        bytes: &[u8],
        stage: Stage,
        expect: &[&str],
    ) -> PathBuf {
        let path = self.folder(name);
        std::fs::write(&path, bytes).expect("write case");
        let mut e: Vec<String> = expect.iter().map(|s| s.to_string()).collect();
        if stage == Stage::Load {
            // Loading errors name the file.
            e.push("model.onnx".into());
        }
        self.cases.push(HostileCase {
            name,
            what,
            model: path.clone(),
            stage,
            expect: e,
            run_args: Vec::new(),
            cli: true,
            limits: attnrt_onnx::Limits::default(),
        });
        path
    }

    fn add(
        &mut self,
        name: &'static str,
        what: &'static str,
        m: &ModelProto,
        stage: Stage,
        expect: &[&str],
    ) -> PathBuf {
        self.add_bytes(name, what, &m.encode_to_vec(), stage, expect)
    }

    fn last(&mut self) -> &mut HostileCase {
        self.cases.last_mut().expect("a case was added")
    }
}

/// Writes every case under `dir` and returns them, in a fixed order.
pub fn write_corpus(dir: &Path) -> Vec<HostileCase> {
    let mut b = Builder {
        root: dir.to_path_buf(),
        cases: Vec::new(),
    };
    let ok = baseline();

    // --- Not a model at all.
    b.add_bytes(
        "empty_file",
        "a 0-byte file",
        &[],
        Stage::Load,
        &["empty file"],
    );
    let big = {
        let mut m = baseline();
        m.graph.as_mut().unwrap().initializer = vec![
            tensor_f32("w", &[4], &[0.5, -0.5, 1.0, -1.0]),
            tensor_f32("pad", &[256], &[0.25; 256]),
        ];
        m.graph.as_mut().unwrap().node[0].input[1] = "w".into();
        m.encode_to_vec()
    };
    b.add_bytes(
        "truncated_protobuf",
        "a valid model cut at 60% of its bytes",
        &big[..big.len() * 6 / 10],
        Stage::Load,
        &["not a valid ONNX model", "truncated or corrupt"],
    );
    b.add_bytes(
        "random_bytes",
        "4 KiB of seeded pseudo-random bytes",
        &pseudo_random_bytes(4096, 0x5eed),
        Stage::Load,
        &["not a valid ONNX model"],
    );
    let entry = StringStringEntryProto {
        key: "k".into(),
        value: "v".into(),
    }
    .encode_to_vec();
    b.add_bytes(
        "protobuf_not_a_model_wire",
        "a valid protobuf of another message (StringStringEntryProto) whose field 1 has the wrong wire type for a model",
        &entry,
        Stage::Load,
        &["not a valid ONNX model", "invalid wire type", "ModelProto.ir_version"],
    );
    let other = node("n", "Relu", &[], &["y"]).encode_to_vec();
    b.add_bytes(
        "protobuf_not_a_model_nograph",
        "a valid protobuf of another message (NodeProto) that decodes as a model without a graph",
        &other,
        Stage::Load,
        &["not an ONNX model", "no graph"],
    );

    // --- Header-level refusals.
    let mut m = ok.clone();
    m.ir_version = 99;
    b.add(
        "ir_version_unknown",
        "IR version 99",
        &m,
        Stage::Load,
        &["IR version 99"],
    );
    let mut m = ok.clone();
    m.opset_import[0].version = 99;
    b.add(
        "opset_unknown",
        "default-domain opset 99",
        &m,
        Stage::Validate,
        &["opset 99", "not one attnrt knows"],
    );
    let mut m = ok.clone();
    m.opset_import = vec![OperatorSetIdProto {
        domain: String::new(),
        version: 17,
    }];
    m.graph.as_mut().unwrap().node[1].domain = "com.example".into();
    b.add(
        "domain_not_imported",
        "a node in a domain the model does not import",
        &m,
        Stage::Validate,
        &["relu", "com.example"],
    );

    // --- Graph structure.
    let mut m = ok.clone();
    m.graph.as_mut().unwrap().node[1].input[0] = "ghost".into();
    b.add(
        "missing_producer",
        "a node reading a tensor nobody produces",
        &m,
        Stage::Validate,
        &["relu", "'ghost'"],
    );
    let mut m = ok.clone();
    {
        let g = m.graph.as_mut().unwrap();
        g.node = vec![
            node("cyc_a", "Add", &["x", "b_out"], &["a_out"]),
            node("cyc_b", "Relu", &["a_out"], &["b_out"]),
            node("tail", "Relu", &["b_out"], &["y"]),
        ];
    }
    b.add(
        "cycle",
        "two nodes feeding each other",
        &m,
        Stage::Validate,
        &["cycle", "cyc_a", "cyc_b"],
    );
    let mut m = ok.clone();
    m.graph
        .as_mut()
        .unwrap()
        .node
        .push(node("relu_again", "Relu", &["s"], &["y"]));
    b.add(
        "duplicate_output",
        "two nodes writing the same tensor",
        &m,
        Stage::Validate,
        &["'y'", "produced twice", "relu_again"],
    );
    let mut m = ok.clone();
    m.graph
        .as_mut()
        .unwrap()
        .output
        .push(float_value("nowhere", &[1]));
    b.add(
        "missing_graph_output",
        "a graph output nothing produces",
        &m,
        Stage::Validate,
        &["'nowhere'"],
    );
    let mut m = ok.clone();
    m.graph.as_mut().unwrap().node[1].op_type = "FlashAttentionPlease".into();
    b.add(
        "unknown_op",
        "a default-domain op ONNX does not have",
        &m,
        Stage::Validate,
        &["relu", "FlashAttentionPlease", "not an ONNX operator"],
    );
    let mut m = ok.clone();
    m.graph.as_mut().unwrap().node[1].op_type = "Attention".into();
    b.add(
        "op_newer_than_opset",
        "the opset-23 Attention op in an opset-17 model",
        &m,
        Stage::Validate,
        &["relu", "'Attention'", "opset 23"],
    );
    let mut m = ok.clone();
    m.graph.as_mut().unwrap().node[1].op_type = String::new();
    b.add(
        "empty_op_type",
        "a node without op_type",
        &m,
        Stage::Validate,
        &["relu", "no op_type"],
    );

    operator_rules(&mut b);

    // --- Tensors.
    b.add(
        "raw_data_length_mismatch",
        "initializer w of dims [4, 4] holding 12 floats",
        &with_initializer(TensorProto {
            raw_data: f32_bytes((0..12).map(|i| i as f32)).into(),
            ..tensor_f32("w", &[4, 4], &[])
        }),
        Stage::Load,
        &["initializer 'w'", "12 float values", "need 16"],
    );
    b.add(
        "raw_data_odd_bytes",
        "initializer w with 15 bytes of raw_data (not a whole number of floats)",
        &with_initializer(TensorProto {
            raw_data: vec![0; 15].into(),
            ..tensor_f32("w", &[4], &[])
        }),
        Stage::Load,
        &["initializer 'w'", "15 bytes"],
    );
    b.add(
        "dims_10e12_elements",
        "initializer w declaring [1000000, 1000000] floats (4 TB) with 16 bytes of data",
        &with_initializer(TensorProto {
            raw_data: vec![0; 16].into(),
            ..tensor_f32("w", &[1_000_000, 1_000_000], &[])
        }),
        Stage::Load,
        &["initializer 'w'", "more than the limit"],
    );
    b.add(
        "dims_overflow_i64",
        "initializer w with dims [2^62, 2^62, 16] whose product overflows 64 bits",
        &with_initializer(tensor_f32("w", &[1 << 62, 1 << 62, 16], &[])),
        Stage::Load,
        &["initializer 'w'", "more than the limit"],
    );
    b.add(
        "negative_dims",
        "initializer w with dims [-1, 4]",
        &with_initializer(TensorProto {
            raw_data: vec![0; 16].into(),
            ..tensor_f32("w", &[-1, 4], &[])
        }),
        Stage::Load,
        &["initializer 'w'", "negative dimension -1"],
    );
    let mut m = ok.clone();
    m.graph.as_mut().unwrap().node.insert(
        0,
        NodeProto {
            attribute: vec![attnrt_onnx::attr::make_tensor(
                "value",
                TensorProto {
                    raw_data: vec![0; 8].into(),
                    ..tensor_f32("c", &[1_000_000, 1_000_000], &[])
                },
            )],
            ..node("huge_const", "Constant", &[], &["c"])
        },
    );
    b.add(
        "constant_attr_10e12",
        "a Constant node whose value tensor declares 10^12 floats",
        &m,
        Stage::Load,
        &["huge_const", "'value'", "more than the limit"],
    );

    // --- Names that are not UTF-8: encode a placeholder name, then overwrite its bytes.
    let mut m = ok.clone();
    m.graph.as_mut().unwrap().node[1].name = "NAME_PLACEHOLDER".into();
    let mut bytes = m.encode_to_vec();
    let at = bytes
        .windows(16)
        .position(|w| w == b"NAME_PLACEHOLDER")
        .expect("placeholder present");
    bytes[at..at + 4].copy_from_slice(&[0xff, 0xfe, 0xc0, 0x80]);
    b.add_bytes(
        "non_utf8_node_name",
        "a node name with bytes FF FE C0 80",
        &bytes,
        Stage::Load,
        &["not UTF-8", "NodeProto.name"],
    );

    // --- External data.
    b.add(
        "external_absolute",
        "external data location /etc/passwd",
        &with_initializer(external_initializer("/etc/passwd", 0, 16)),
        Stage::Load,
        &["initializer 'w'", "'/etc/passwd'", "absolute"],
    );
    let model_path = b.add(
        "external_dotdot",
        "external data location ../secret.bin (the file exists)",
        &with_initializer(external_initializer("../secret.bin", 0, 16)),
        Stage::Load,
        &["initializer 'w'", "'../secret.bin'", "'..'"],
    );
    std::fs::write(
        model_path
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("secret.bin"),
        f32_bytes([9.0; 4]),
    )
    .unwrap();
    let model_path = b.add(
        "external_symlink_out",
        "external data location link.bin, a symlink to a file outside the model's folder",
        &with_initializer(external_initializer("link.bin", 0, 16)),
        Stage::Load,
        &[
            "initializer 'w'",
            "'link.bin'",
            "outside the model's folder",
        ],
    );
    {
        let dir = model_path.parent().unwrap();
        let outside = dir.parent().unwrap().join("outside_secret.bin");
        std::fs::write(&outside, f32_bytes([7.0; 4])).unwrap();
        let link = dir.join("link.bin");
        let _ = std::fs::remove_file(&link);
        #[cfg(unix)]
        std::os::unix::fs::symlink(&outside, &link).unwrap();
    }
    let model_path = b.add(
        "external_past_eof",
        "external data offset 8 + length 16 in an 8-byte file",
        &with_initializer(external_initializer("w.bin", 8, 16)),
        Stage::Load,
        &["initializer 'w'", "'w.bin'", "past the end of the file"],
    );
    std::fs::write(model_path.parent().unwrap().join("w.bin"), [0u8; 8]).unwrap();
    let model_path = b.add(
        "external_offset_overflow",
        "external data offset u64::MAX - 4 (offset + length overflows)",
        &with_initializer(external_initializer("w.bin", u64::MAX - 4, 16)),
        Stage::Load,
        &["initializer 'w'", "'w.bin'", "past the end of the file"],
    );
    std::fs::write(model_path.parent().unwrap().join("w.bin"), [0u8; 64]).unwrap();
    b.add(
        "external_missing_file",
        "external data in a file that does not exist",
        &with_initializer(external_initializer("nope.bin", 0, 16)),
        Stage::Load,
        &["initializer 'w'", "'nope.bin'", "not found"],
    );
    b.add(
        "external_10e12",
        "external tensor declaring 10^12 floats",
        &with_initializer(TensorProto {
            dims: vec![1_000_000, 1_000_000],
            ..external_initializer("w.bin", 0, 4_000_000_000_000)
        }),
        Stage::Load,
        &["initializer 'w'", "more than the limit"],
    );

    // --- Functions.
    b.add(
        "function_explosion",
        "40 model-local functions each calling the next twice (2^40 nodes inlined)",
        &exploding_functions(40),
        Stage::Validate,
        &["function 'f", "expands to more than the limit"],
    );
    let mut m = exploding_functions(2);
    m.functions[1].node[0].op_type = "f0".into();
    m.functions[1].node[0].domain = "local".into();
    b.add(
        "function_recursion",
        "model-local functions f0 → f1 → f0",
        &m,
        Stage::Validate,
        &["calls itself"],
    );

    // --- Nesting.
    b.add_bytes(
        "subgraphs_5000_deep",
        "If/Loop bodies nested 5000 deep (past prost's recursion limit)",
        &nested_subgraphs_bytes(5000),
        Stage::Load,
        &["nested more than 100 deep"],
    );
    b.add_bytes(
        "subgraphs_past_depth_limit",
        "If/Loop bodies nested 12 deep with the subgraph depth limit lowered to 8",
        &nested_subgraphs_bytes(12),
        Stage::Load,
        &["nested more than the limit of 8 deep", "node loop_4"],
    );
    b.last().limits.max_subgraph_depth = 8;
    b.last().cli = false; // no --max-subgraph-depth flag; the 5000-deep case covers the CLI

    // --- Limits.
    b.add(
        "model_over_size_limit",
        "the baseline model with --max-model-bytes 64",
        &ok,
        Stage::Load,
        &["over the model size limit of 64 bytes"],
    );
    b.last().limits.max_model_bytes = 64;
    b.last().run_args = vec!["--max-model-bytes".into(), "64".into()];
    b.add(
        "nodes_over_limit",
        "a 5000-node chain with --max-nodes 1000",
        &chain_model(5000),
        Stage::Load,
        &["more than the limit of 1000 nodes"],
    );
    b.last().limits.max_nodes = 1000;
    b.last().run_args = vec!["--max-nodes".into(), "1000".into()];
    b.add(
        "tensor_over_element_limit",
        "the baseline model with --max-tensor-elements 2 (w has 4, x and y 8)",
        &ok,
        Stage::Load,
        &["initializer 'w'", "more than the limit of 2 elements"],
    );
    b.last().limits.max_tensor_elements = 2;
    b.last().run_args = vec!["--max-tensor-elements".into(), "2".into()];

    // --- Valid models whose run would allocate terabytes.
    let mut m = ok.clone();
    {
        let g = m.graph.as_mut().unwrap();
        g.initializer
            .push(tensor_i64("big_shape", &[2], &[1_000_000, 1_000_000]));
        g.node
            .push(node("fill", "ConstantOfShape", &["big_shape"], &["filled"]));
        g.output.push(ValueInfoProto {
            name: "filled".into(),
            ..Default::default()
        });
    }
    b.add(
        "constant_of_shape_10e12",
        "ConstantOfShape of an initializer shape [10^6, 10^6] (4 TB)",
        &m,
        Stage::Allocation,
        &[
            "fill",
            "ConstantOfShape",
            "'filled'",
            "1000000000000 elements",
        ],
    );
    let mut m = ok.clone();
    {
        let g = m.graph.as_mut().unwrap();
        g.node.push(NodeProto {
            attribute: vec![attnrt_onnx::attr::make_ints(
                "value_ints",
                &[1_000_000, 1_000_000, 1, 4],
            )],
            ..node("shape_const", "Constant", &[], &["big_shape"])
        });
        g.node
            .push(node("grow", "Expand", &["y", "big_shape"], &["expanded"]));
        g.output.push(ValueInfoProto {
            name: "expanded".into(),
            ..Default::default()
        });
    }
    b.add(
        "expand_10e12",
        "Expand of y [2, 4] to a Constant shape [10^6, 10^6, 1, 4] (8·10^12 elements)",
        &m,
        Stage::Allocation,
        &["grow", "Expand", "'expanded'", "8000000000000 elements"],
    );
    let mut m = ok.clone();
    // [.., 4]: x + w must still broadcast, or the validator refuses the model first.
    m.graph.as_mut().unwrap().input[0] = float_value("x", &[1_000_000, 1_000_000, 4]);
    b.add(
        "input_declared_10e12",
        "graph input x declared as [10^6, 10^6, 4] floats",
        &m,
        Stage::Allocation,
        &["'x'", "declared", "elements"],
    );

    // --- Input files (`attnrt run` only).
    let model_path = b.add(
        "npy_wrong_dtype",
        "--input x=x.npy holding int64 for a float input",
        &ok,
        Stage::Inputs,
        &["x.npy", "'x'"],
    );
    let dir = model_path.parent().unwrap().to_path_buf();
    std::fs::write(dir.join("x.npy"), npy_bytes("<i8", &[2, 4], &[0u8; 64])).unwrap();
    b.last().run_args = vec![
        "--input".into(),
        format!("x={}", dir.join("x.npy").display()),
    ];
    let model_path = b.add(
        "npy_wrong_shape",
        "--input x=x.npy of shape [3, 3] for x [2, 4]",
        &ok,
        Stage::Inputs,
        &["x.npy", "'x'", "[3, 3]"],
    );
    let dir = model_path.parent().unwrap().to_path_buf();
    std::fs::write(
        dir.join("x.npy"),
        npy_bytes("<f4", &[3, 3], &f32_bytes([1.0; 9])),
    )
    .unwrap();
    b.last().run_args = vec![
        "--input".into(),
        format!("x={}", dir.join("x.npy").display()),
    ];
    let model_path = b.add(
        "npy_truncated",
        "--input x=x.npy whose data stops after 3 of 8 floats",
        &ok,
        Stage::Inputs,
        &["x.npy", "'x'"],
    );
    let dir = model_path.parent().unwrap().to_path_buf();
    std::fs::write(
        dir.join("x.npy"),
        npy_bytes("<f4", &[2, 4], &f32_bytes([1.0; 3])),
    )
    .unwrap();
    b.last().run_args = vec![
        "--input".into(),
        format!("x={}", dir.join("x.npy").display()),
    ];
    let model_path = b.add(
        "npz_missing_input",
        "--input-npz holding only an array 'other'",
        &ok,
        Stage::Inputs,
        &["in.npz", "'x'"],
    );
    let dir = model_path.parent().unwrap().to_path_buf();
    std::fs::write(
        dir.join("in.npz"),
        npz_bytes(&[("other", npy_bytes("<f4", &[2, 4], &f32_bytes([1.0; 8])))]),
    )
    .unwrap();
    b.last().run_args = vec![
        "--input-npz".into(),
        dir.join("in.npz").display().to_string(),
    ];

    b.cases
}

/// Operators whose attributes or inputs break the operator's rules (issue 28: a mutation
/// fuzzer's findings, on which tract hung or ate memory and ONNX Runtime refuses at load).
fn operator_rules(b: &mut Builder) {
    let one = |n: NodeProto, inputs: Vec<ValueInfoProto>, inits: Vec<TensorProto>| {
        model(GraphProto {
            name: "op".into(),
            output: vec![float_value(&n.output[0], &[])],
            node: vec![n],
            initializer: inits,
            input: inputs,
            ..Default::default()
        })
    };
    let x4 = || vec![float_value("x", &[1, 2, 3, 4])];
    let perm = vec![make_ints("perm", &[0, 1, 1, 3])];
    b.add(
        "transpose_perm_repeated",
        "a Transpose whose perm [0, 1, 1, 3] repeats an axis",
        &one(
            node_with_attrs("t", "Transpose", &["x"], &["y"], perm),
            x4(),
            vec![],
        ),
        Stage::Validate,
        &["'t'", "perm [0, 1, 1, 3]", "repeats axis 1"],
    );
    let ln = node_with_attrs(
        "ln",
        "LayerNormalization",
        &["x", "w"],
        &["y"],
        vec![make_int("axis", 4)],
    );
    b.add(
        "layernorm_axis_out_of_range",
        "a LayerNormalization with axis 4 on a rank-4 input",
        &one(ln, x4(), vec![tensor_f32("w", &[4], &[1.0; 4])]),
        Stage::Validate,
        &["'ln'", "attribute axis 4 is outside", "rank 4"],
    );
    b.add(
        "matmul_one_input",
        "a MatMul given one input",
        &one(node("mm", "MatMul", &["x"], &["y"]), x4(), vec![]),
        Stage::Validate,
        &["'mm'", "1 input(s)", "takes 2"],
    );
    b.add(
        "reshape_product_mismatch",
        "a Reshape of 24 elements to [5, -1]",
        &one(
            node("r", "Reshape", &["x", "s"], &["y"]),
            x4(),
            vec![tensor_i64("s", &[2], &[5, -1])],
        ),
        Stage::Validate,
        &["'r'", "input 1 's' [5, -1]", "has 24"],
    );
}

/// Where the npy/npz inputs of an `Inputs` case are, as `prepare_inputs` takes them:
/// (`--input` pairs, `--input-npz` file).
pub fn input_files(case: &HostileCase) -> (Vec<(String, PathBuf)>, Option<PathBuf>) {
    let mut npy = Vec::new();
    let mut npz = None;
    let mut args = case.run_args.iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--input" => {
                let v = args.next().expect("--input value");
                let (name, path) = v.split_once('=').expect("name=path");
                npy.push((name.to_string(), PathBuf::from(path)));
            }
            "--input-npz" => npz = Some(PathBuf::from(args.next().expect("--input-npz value"))),
            _ => {}
        }
    }
    (npy, npz)
}
