//! Embedding lookups read their table in place from the model's mapped bytes
//! (`embedding.rs`): for a model whose table is in external data, as for one whose table is
//! inline, a lookup gives exactly the table's rows, any index out of range is an error naming
//! the node (never a panic), and a table something else reads too stays a constant and gives
//! the same values.

use std::path::Path;

use attnrt_onnx::{attr, load_model, save_model, DataType, Limits, ModelProto, SaveOptions};
use attnrt_runtime::{NamedTensor, Session, SessionOptions, Tensor, Threads};
use attnrt_testkit::GraphBuilder;
use attnrt_testkit::{float_value, node, node_with_attrs, seeded_values, tensor_f32, value_info};

const ROWS: usize = 1024;
const WIDTH: usize = 256;
const TOKENS: usize = 5;

fn table() -> Vec<f32> {
    seeded_values(ROWS * WIDTH, 3)
}

/// `y = Gather(table, ids)` (ids `[1, TOKENS]` of `ids_type`), `z = Gather(table, ids, axis 1)`
/// of a second table `t2` read by columns (not a row lookup), and `g3 = Gather(t3, ids)` with
/// `d = t3 + t3`: `t3` is read by an `Add` too. Each table is 1 MiB: held out of tract's graph, and mapped
/// from its file.
fn model(ids_type: DataType) -> ModelProto {
    let mut g = GraphBuilder::new("embedding");
    g.input(value_info("ids", ids_type, &[1, TOKENS as i64]));
    let dims = [ROWS as i64, WIDTH as i64];
    g.initializer(tensor_f32("table", &dims, &table()));
    g.initializer(tensor_f32("t2", &[WIDTH as i64, ROWS as i64], &table()));
    g.initializer(tensor_f32("t3", &dims, &table()));
    g.node(node("/embed/Gather", "Gather", &["table", "ids"], &["y"]));
    let by_column = vec![attr::make_int("axis", 1)];
    g.node(node_with_attrs(
        "/cols/Gather",
        "Gather",
        &["t2", "ids"],
        &["z"],
        by_column,
    ));
    g.node(node("/t3/Gather", "Gather", &["t3", "ids"], &["g3"]));
    g.node(node("/t3/Add", "Add", &["t3", "t3"], &["d"]));
    g.output(float_value("y", &[1, TOKENS as i64, WIDTH as i64]));
    g.output(float_value("z", &[WIDTH as i64, 1, TOKENS as i64]));
    g.output(float_value("g3", &[1, TOKENS as i64, WIDTH as i64]));
    g.output(float_value("d", &dims));
    g.into_model(17)
}

fn ids(values: &[i64], ids_type: DataType) -> Vec<NamedTensor> {
    let tensor = match ids_type {
        DataType::Int32 => {
            let v: Vec<i32> = values.iter().map(|&i| i as i32).collect();
            Tensor::from_shape(&[1, values.len()], &v).unwrap()
        }
        _ => Tensor::from_shape(&[1, values.len()], values).unwrap(),
    };
    vec![NamedTensor {
        name: "ids".into(),
        tensor,
    }]
}

fn values(t: &NamedTensor) -> Vec<f32> {
    t.tensor
        .try_as_plain_ram()
        .unwrap()
        .as_slice::<f32>()
        .unwrap()
        .to_vec()
}

/// What the four outputs must be for `ids`, from the table's values.
fn expected(ids: &[i64]) -> [Vec<f32>; 4] {
    let t = table();
    let row = |i: i64| {
        let i = i.rem_euclid(ROWS as i64) as usize;
        t[i * WIDTH..(i + 1) * WIDTH].to_vec()
    };
    let y: Vec<f32> = ids.iter().flat_map(|&i| row(i)).collect();
    // `t2` is `[WIDTH, ROWS]`: z[r][0][k] = t2[r][ids[k]]; `ids` index its columns.
    let col = |r: usize, i: i64| t[r * ROWS + i.rem_euclid(ROWS as i64) as usize];
    let z = (0..WIDTH)
        .flat_map(|r| ids.iter().map(move |&i| col(r, i)))
        .collect();
    let d = t.iter().map(|v| v + v).collect();
    [y.clone(), z, y, d]
}

fn session(path: &Path, ids_type: DataType) -> Session {
    let loaded = load_model(path, &Limits::default()).unwrap();
    let threads = Threads::new(Some(2)).unwrap();
    let first = ids(&[0, 1, 2, 3, 4], ids_type);
    let what = path.file_name().unwrap().to_str().unwrap();
    Session::build_with_options(
        &loaded.model,
        &first,
        &threads,
        what,
        &SessionOptions::default(),
    )
    .unwrap()
}

fn saved(dir: &Path, ids_type: DataType, external: bool) -> std::path::PathBuf {
    let path = dir.join(if external { "ext.onnx" } else { "inline.onnx" });
    let options = SaveOptions {
        external_threshold: external.then_some(1024),
        ..SaveOptions::default()
    };
    save_model(&model(ids_type), &path, &options).unwrap();
    path
}

#[test]
fn lookups_from_external_and_inline_tables_give_the_rows_and_refuse_bad_indices() {
    let dir = tempfile::tempdir().unwrap();
    for (ids_type, external) in [
        (DataType::Int64, true),
        (DataType::Int64, false),
        (DataType::Int32, true),
    ] {
        let path = saved(dir.path(), ids_type, external);
        let s = session(&path, ids_type);
        for pick in [[0, 1, 2, 3, 4], [1023, 7, -1, -1024, 512]] {
            let out = s.run(&ids(&pick, ids_type)).unwrap();
            let want = expected(&pick);
            for (got, want) in out.iter().zip(&want) {
                // Copied, not computed: bit for bit.
                assert!(values(got) == *want, "{} at {pick:?}", got.name);
            }
        }
        for bad in [1024, -1025, i32::MAX as i64] {
            let pick = [0, 1, bad, 3, 4];
            let err = format!("{:#}", s.run(&ids(&pick, ids_type)).unwrap_err());
            assert!(
                err.contains(&format!("index {bad} is outside [-1024, 1024)")),
                "{err}"
            );
            assert!(
                err.contains("/embed/Gather") || err.contains("/t3/Gather"),
                "{err}"
            );
            assert!(!err.contains("panic"), "{err}");
        }
    }
}

/// The lookup's own node is named when only its table is too short for the index.
#[test]
fn a_bad_index_names_the_lookup_that_reads_in_place() {
    let mut g = GraphBuilder::new("lookup");
    g.input(value_info("ids", DataType::Int64, &[1, 2]));
    g.initializer(tensor_f32("wte", &[ROWS as i64, WIDTH as i64], &table()));
    g.node(node("/wte/Gather", "Gather", &["wte", "ids"], &["y"]));
    g.output(float_value("y", &[1, 2, WIDTH as i64]));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wte.onnx");
    let options = SaveOptions {
        external_threshold: Some(1024),
        ..SaveOptions::default()
    };
    save_model(&g.into_model(17), &path, &options).unwrap();
    let loaded = load_model(&path, &Limits::default()).unwrap();
    let threads = Threads::new(Some(1)).unwrap();
    let s = Session::new(
        &loaded.model,
        &threads,
        "wte.onnx",
        &SessionOptions::default(),
    )
    .unwrap();
    let out = s.run(&ids(&[5, -2], DataType::Int64)).unwrap();
    let t = table();
    let want: Vec<f32> = [5, ROWS - 2]
        .iter()
        .flat_map(|&i| t[i * WIDTH..(i + 1) * WIDTH].to_vec())
        .collect();
    assert!(values(&out[0]) == want);
    let err = format!(
        "{:#}",
        s.run(&ids(&[5, 4096], DataType::Int64)).unwrap_err()
    );
    assert!(
        err.contains("wte.onnx")
            && err.contains("Gather node '/wte/Gather': index 4096 is outside [-1024, 1024)"),
        "{err}"
    );
}
