//! Load → save → load is lossless on every shipped model, external data stays confined,
//! and the structural validator and opset upgrade do what they say.

mod common;

use std::path::{Path, PathBuf};

use common::{models_dir, shipped_models};

use attnrt_onnx::proto::{
    tensor_proto::DataLocation, FunctionProto, GraphProto, ModelProto, NodeProto,
    OperatorSetIdProto, StringStringEntryProto, TensorProto, ValueInfoProto,
};
use attnrt_onnx::validate::validate_model_with;
use attnrt_onnx::{
    attr, load_model, opset, save_model, tensor, validate_model, Limits, MemoryBudget, SaveOptions,
    ValidationError,
};
use prost::Message;

#[test]
fn every_shipped_model_round_trips_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    for path in shipped_models() {
        let loaded = load_model(&path, &Limits::default()).unwrap();
        validate_model(&loaded.model).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // Bytes → model → bytes → model is the identity on the decoded model.
        let again = ModelProto::decode(loaded.model.encode_to_vec().as_slice()).unwrap();
        assert_eq!(again, loaded.model, "{}", path.display());
        // Through a file, inline...
        let out = dir.path().join("copy.onnx");
        save_model(&loaded.model, &out, &SaveOptions::default()).unwrap();
        let reloaded = load_model(&out, &Limits::default()).unwrap();
        assert_eq!(reloaded.model, loaded.model, "{}", path.display());
        // ...and with every tensor of 64 bytes or more moved to external data.
        let out = dir.path().join("ext.onnx");
        let opts = SaveOptions {
            external_threshold: Some(64),
            ..Default::default()
        };
        save_model(&loaded.model, &out, &opts).unwrap();
        let raw = ModelProto::decode(std::fs::read(&out).unwrap().as_slice()).unwrap();
        let external = raw
            .graph
            .as_ref()
            .unwrap()
            .initializer
            .iter()
            .filter(|t| t.data_location == DataLocation::External as i32)
            .count();
        let big = loaded
            .model
            .graph
            .as_ref()
            .unwrap()
            .initializer
            .iter()
            .filter(|t| t.raw_data.len() >= 64)
            .count();
        assert_eq!(external, big, "{}", path.display());
        let reloaded = load_model(&out, &Limits::default()).unwrap();
        assert_eq!(reloaded.model, loaded.model, "{}", path.display());
    }
}

#[test]
fn shipped_external_data_model_loads_like_the_inline_one() {
    let ext = load_model(
        &models_dir().join("mha_seed.ts.extdata.onnx"),
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(
        ext.external_files,
        vec!["mha_seed.ts.extdata.onnx.data".to_string()]
    );
    let inline = load_model(&models_dir().join("mha_seed.ts.onnx"), &Limits::default()).unwrap();
    let values = |m: &ModelProto| {
        let mut v: Vec<(String, Vec<f32>)> = m
            .graph
            .as_ref()
            .unwrap()
            .initializer
            .iter()
            .filter(|t| t.data_type == 1)
            .map(|t| (t.name.clone(), tensor::to_f32(t).unwrap()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    assert_eq!(values(&ext.model), values(&inline.model));
}

/// A float32 initializer `name` of `dims` whose data is `length` bytes at `offset` in `location`.
fn external_tensor(
    name: &str,
    dims: &[i64],
    location: &str,
    offset: u64,
    length: u64,
) -> TensorProto {
    let mut w = tensor::from_f32(name, &[1], &[0.0]);
    w.dims = dims.to_vec();
    w.raw_data.clear();
    let e = |k: &str, v: String| StringStringEntryProto {
        key: k.into(),
        value: v,
    };
    w.external_data = vec![
        e("location", location.into()),
        e("offset", offset.to_string()),
        e("length", length.to_string()),
    ];
    w.data_location = DataLocation::External as i32;
    w
}

/// A model whose one initializer lives in `location`, written into `dir`.
fn external_model(dir: &Path, location: &str, offset: u64, length: u64) -> PathBuf {
    let w = external_tensor("w", &[4], location, offset, length);
    let mut model = tiny_model(vec![node("Relu", &["w"], &["y"])], &[], &["y"]);
    model.graph.as_mut().unwrap().initializer.push(w);
    let path = dir.join("model.onnx");
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    path
}

/// A file of `len` bytes that takes no disk space (a hole), with `head` written at `at`.
fn sparse_file(path: &Path, len: u64, at: u64, head: &[u8]) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::File::create(path).unwrap();
    f.set_len(len).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(head).unwrap();
}

#[test]
fn over_2_gib_of_external_data_loads_with_the_default_limits() {
    // The two layouts of large models: the TorchScript exporter's one file per tensor ("a") and
    // one data file holding many (optimum's "weights.data", its last tensor past 4 GiB), 2.25 GiB
    // of external data in all, in sparse files. The limits are the default ones of a machine
    // whose memory budget is 8 GiB (a 24 GB machine with other work on it).
    const GIB: u64 = 1 << 30;
    let dir = tempfile::tempdir().unwrap();
    let values: Vec<u8> = [1.5f32, -2.0, 3.25, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    sparse_file(&dir.path().join("a"), GIB + GIB / 4, 0, &[]);
    sparse_file(
        &dir.path().join("weights.data"),
        4 * GIB + GIB / 2,
        4 * GIB + GIB / 4,
        &values,
    );
    let a = external_tensor("a", &[(GIB + GIB / 4) as i64 / 4], "a", 0, GIB + GIB / 4);
    let b = external_tensor("b", &[2048, GIB as i64 / 8192], "weights.data", 0, GIB);
    let c = external_tensor("c", &[4], "weights.data", 4 * GIB + GIB / 4, 16);
    let mut model = tiny_model(
        vec![
            node("Relu", &["a"], &["ya"]),
            node("Relu", &["b"], &["yb"]),
            node("Relu", &["c"], &["yc"]),
        ],
        &[],
        &["ya", "yb", "yc"],
    );
    model.graph.as_mut().unwrap().initializer.extend([a, b, c]);
    let path = dir.path().join("model.onnx");
    std::fs::write(&path, model.encode_to_vec()).unwrap();

    let limits = Limits::within(&MemoryBudget::new(8 * GIB));
    let loaded = load_model(&path, &limits).unwrap();
    let init = &loaded.model.graph.as_ref().unwrap().initializer;
    let lens: Vec<u64> = init.iter().map(|t| t.raw_data.len() as u64).collect();
    assert_eq!(lens, vec![GIB + GIB / 4, GIB, 16]);
    assert_eq!(
        tensor::to_f32(&init[2]).unwrap(),
        vec![1.5, -2.0, 3.25, 4.0]
    );
    assert_eq!(loaded.external_files, vec!["a", "weights.data"]);

    // The total is what the limit counts: below 2.25 GiB the same model is refused.
    let tight = Limits {
        max_external_bytes: 2 * GIB,
        ..limits
    };
    let err = format!("{:#}", load_model(&path, &tight).unwrap_err());
    assert!(
        err.contains("initializer 'b'") && err.contains("external data totals"),
        "{err}"
    );
}

#[test]
fn external_data_must_stay_inside_the_models_folder() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    std::fs::create_dir(&dir).unwrap();
    let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(dir.join("w.bin"), &bytes).unwrap();
    std::fs::write(root.path().join("outside.bin"), &bytes).unwrap();

    let ok = external_model(&dir, "w.bin", 0, 16);
    let m = load_model(&ok, &Limits::default()).unwrap();
    let w = &m.model.graph.as_ref().unwrap().initializer[0];
    assert_eq!(tensor::to_f32(w).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    assert!(w.external_data.is_empty());

    let cases: Vec<(String, u64, u64, &str)> = vec![
        (
            root.path().join("outside.bin").display().to_string(),
            0,
            16,
            "is absolute",
        ),
        ("../outside.bin".into(), 0, 16, "contains '..'"),
        ("w.bin".into(), 8, 16, "past the end of the file"),
        ("w.bin".into(), 0, 12, "does not match the 16 bytes"),
        ("missing.bin".into(), 0, 16, "not found next to the model"),
    ];
    for (location, offset, length, expected) in cases {
        let p = external_model(&dir, &location, offset, length);
        let err = format!("{:#}", load_model(&p, &Limits::default()).unwrap_err());
        assert!(err.contains(expected), "{location}: {err}");
        assert!(err.contains("initializer 'w'"), "{err}");
    }
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(root.path().join("outside.bin"), dir.join("link.bin")).unwrap();
        let p = external_model(&dir, "link.bin", 0, 16);
        let err = format!("{:#}", load_model(&p, &Limits::default()).unwrap_err());
        assert!(err.contains("outside the model's folder"), "{err}");
    }
}

#[test]
fn not_a_model_is_refused_with_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty.onnx", vec![], "empty file"),
        (
            "random.onnx",
            (0..200u32).map(|i| (i * 7919 % 251) as u8).collect(),
            "not a valid ONNX model",
        ),
        (
            "nograph.onnx",
            ModelProto {
                ir_version: 8,
                ..Default::default()
            }
            .encode_to_vec(),
            "no graph",
        ),
    ];
    for (name, bytes, expected) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let err = format!("{:#}", load_model(&p, &Limits::default()).unwrap_err());
        assert!(
            err.contains(expected) && err.contains(name),
            "{name}: {err}"
        );
    }
    let full = std::fs::read(models_dir().join("mha_seed.ts.onnx")).unwrap();
    let p = dir.path().join("truncated.onnx");
    std::fs::write(&p, &full[..full.len() / 2]).unwrap();
    let err = format!("{:#}", load_model(&p, &Limits::default()).unwrap_err());
    assert!(
        err.contains("truncated.onnx") && err.contains("not a valid ONNX model"),
        "{err}"
    );
}

#[test]
fn tensors_are_checked_against_limits_before_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = tiny_model(vec![node("Relu", &["w"], &["y"])], &[], &["y"]);
    let mut w = tensor::from_f32("w", &[4], &[0.0; 4]);
    w.dims = vec![1_000_000, 1_000_000];
    model.graph.as_mut().unwrap().initializer.push(w);
    let p = dir.path().join("huge.onnx");
    std::fs::write(&p, model.encode_to_vec()).unwrap();
    let err = format!("{:#}", load_model(&p, &Limits::default()).unwrap_err());
    assert!(
        err.contains("initializer 'w'") && err.contains("limit"),
        "{err}"
    );

    let tight = Limits {
        max_nodes: 2,
        ..Limits::default()
    };
    let model = tiny_model(
        vec![
            node("Relu", &["x"], &["a"]),
            node("Relu", &["a"], &["b"]),
            node("Relu", &["b"], &["y"]),
        ],
        &["x"],
        &["y"],
    );
    let p = dir.path().join("many.onnx");
    std::fs::write(&p, model.encode_to_vec()).unwrap();
    let err = format!("{:#}", load_model(&p, &tight).unwrap_err());
    assert!(err.contains("limit of 2 nodes"), "{err}");
}

fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: format!("{op}_{}", outputs.first().unwrap_or(&"")),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn value(name: &str) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        ..Default::default()
    }
}

fn tiny_model(nodes: Vec<NodeProto>, inputs: &[&str], outputs: &[&str]) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: nodes,
            input: inputs.iter().map(|i| value(i)).collect(),
            output: outputs.iter().map(|o| value(o)).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn validator_finds_each_structural_fault() {
    let ok = tiny_model(
        vec![node("Relu", &["a"], &["y"]), node("Neg", &["x"], &["a"])],
        &["x"],
        &["y"],
    );
    // Unsorted but sortable is valid; the order puts the producer first.
    validate_model(&ok).unwrap();
    assert_eq!(
        attnrt_onnx::validate::topo_order(ok.graph.as_ref().unwrap()).unwrap(),
        vec![1, 0]
    );

    let missing = tiny_model(vec![node("Relu", &["nobody"], &["y"])], &["x"], &["y"]);
    assert_eq!(
        validate_model(&missing).unwrap_err(),
        ValidationError::MissingInput {
            node: "Relu_y".into(),
            tensor: "nobody".into()
        }
    );

    let dup = tiny_model(
        vec![node("Relu", &["x"], &["y"]), node("Neg", &["x"], &["y"])],
        &["x"],
        &["y"],
    );
    assert!(matches!(
        validate_model(&dup).unwrap_err(),
        ValidationError::DuplicateProducer { tensor, .. } if tensor == "y"
    ));

    let cycle = tiny_model(
        vec![
            node("Add", &["x", "b"], &["a"]),
            node("Relu", &["a"], &["b"]),
            node("Neg", &["b"], &["y"]),
        ],
        &["x"],
        &["y"],
    );
    let err = validate_model(&cycle).unwrap_err();
    assert!(matches!(err, ValidationError::Cycle { .. }), "{err}");
    assert!(err.to_string().contains("Add_a"), "{err}");

    let no_out = tiny_model(vec![node("Relu", &["x"], &["a"])], &["x"], &["y"]);
    assert_eq!(
        validate_model(&no_out).unwrap_err(),
        ValidationError::MissingOutput { tensor: "y".into() }
    );

    let mut foreign = tiny_model(vec![node("Relu", &["x"], &["y"])], &["x"], &["y"]);
    foreign.graph.as_mut().unwrap().node[0].domain = "com.example".into();
    assert!(matches!(
        validate_model(&foreign).unwrap_err(),
        ValidationError::MissingOpset { domain, .. } if domain == "com.example"
    ));

    let mut future = tiny_model(vec![node("Relu", &["x"], &["y"])], &["x"], &["y"]);
    future.opset_import[0].version = 99;
    assert_eq!(
        validate_model(&future).unwrap_err(),
        ValidationError::UnknownOpset { version: 99 }
    );
}

#[test]
fn subgraphs_see_outer_names_and_are_checked() {
    let then_branch = GraphProto {
        name: "then".into(),
        node: vec![node("Neg", &["x"], &["t"])],
        output: vec![value("t")],
        ..Default::default()
    };
    let mut if_node = node("If", &["c"], &["y"]);
    if_node.attribute.push(attnrt_onnx::AttributeProto {
        name: "then_branch".into(),
        r#type: attnrt_onnx::AttributeType::Graph as i32,
        g: Some(then_branch.clone()),
        ..Default::default()
    });
    let model = tiny_model(vec![if_node.clone()], &["x", "c"], &["y"]);
    validate_model(&model).unwrap();

    let mut bad_branch = then_branch;
    bad_branch.node[0].input[0] = "ghost".into();
    if_node.attribute[0].g = Some(bad_branch);
    let model = tiny_model(vec![if_node], &["x", "c"], &["y"]);
    assert!(matches!(
        validate_model(&model).unwrap_err(),
        ValidationError::MissingInput { tensor, .. } if tensor == "ghost"
    ));
}

fn function(name: &str, calls: &[&str]) -> FunctionProto {
    FunctionProto {
        name: name.into(),
        domain: "local".into(),
        input: vec!["i".into()],
        output: vec!["o".into()],
        node: calls
            .iter()
            .enumerate()
            .map(|(k, c)| NodeProto {
                op_type: c.to_string(),
                domain: if *c == "Relu" {
                    String::new()
                } else {
                    "local".into()
                },
                input: vec![if k == 0 {
                    "i".into()
                } else {
                    format!("t{}", k - 1)
                }],
                output: vec![if k + 1 == calls.len() {
                    "o".into()
                } else {
                    format!("t{k}")
                }],
                ..Default::default()
            })
            .collect(),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        ..Default::default()
    }
}

#[test]
fn functions_may_not_recurse_or_explode() {
    let mut model = tiny_model(vec![node("Relu", &["x"], &["y"])], &["x"], &["y"]);
    model.functions = vec![function("f", &["g"]), function("g", &["f"])];
    assert!(matches!(
        validate_model(&model).unwrap_err(),
        ValidationError::RecursiveFunction { .. }
    ));

    // f0 calls f1 twice, f1 calls f2 twice, ...: 2^40 nodes once inlined.
    let mut fs = Vec::new();
    for i in 0..40 {
        let callee = format!("f{}", i + 1);
        fs.push(function(&format!("f{i}"), &[&callee, &callee]));
    }
    fs.push(function("f40", &["Relu"]));
    model.functions = fs;
    let err = validate_model_with(&model, &Limits::default()).unwrap_err();
    assert!(
        matches!(err, ValidationError::FunctionExpansion { .. }),
        "{err}"
    );
}

#[test]
fn opset_upgrade_converts_changed_signatures() {
    let mut reduce = node("ReduceMean", &["x"], &["m"]);
    reduce.attribute.push(attr::make_ints("axes", &[-1]));
    let split = node("Split", &["m"], &["a", "b"]);
    let mut model = tiny_model(
        vec![reduce, split, node("Add", &["a", "b"], &["y"])],
        &["x"],
        &["y"],
    );
    let report = opset::upgrade_to(&mut model, 23).unwrap();
    assert_eq!((report.from, report.to), (17, 23));
    assert_eq!(report.converted.len(), 2, "{:?}", report.converted);
    assert_eq!(opset::default_version(&model), Some(23));
    assert_eq!(model.ir_version, 11);
    let g = model.graph.as_ref().unwrap();
    assert_eq!(g.node[0].input, vec!["x".to_string(), "m_axes".to_string()]);
    assert!(attr::find(&g.node[0], "axes").is_none());
    assert_eq!(tensor::to_i64(&g.initializer[0]).unwrap(), vec![-1]);
    assert_eq!(attr::int(&g.node[1], "num_outputs").unwrap(), Some(2));
    validate_model(&model).unwrap();

    let mut refused = tiny_model(
        vec![node("GroupNormalization", &["x"], &["y"])],
        &["x"],
        &["y"],
    );
    let before = refused.clone();
    let err = opset::upgrade_to(&mut refused, 23).unwrap_err().to_string();
    assert!(err.contains("GroupNormalization_y"), "{err}");
    assert_eq!(refused, before, "a refused upgrade changes nothing");
}

#[test]
fn save_is_atomic_and_refuses_invalid_models() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.onnx");
    std::fs::write(&out, b"previous").unwrap();
    let invalid = tiny_model(vec![node("Relu", &["nobody"], &["y"])], &["x"], &["y"]);
    let err = format!(
        "{:#}",
        save_model(&invalid, &out, &SaveOptions::default()).unwrap_err()
    );
    assert!(
        err.contains("refusing to write") && err.contains("nobody"),
        "{err}"
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"previous");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "no temporary file is left behind");
    let err = save_model(
        &tiny_model(vec![], &["x"], &["x"]),
        &dir.path().join("no/such/dir/m.onnx"),
        &SaveOptions::default(),
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("no/such/dir"), "{err:#}");
}
