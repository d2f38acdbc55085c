//! No committed model names a machine's folders (issue 28): the dynamo exporter writes a stack
//! trace per node into its metadata, with the absolute paths of the checkout and the venv it
//! ran in. `models/metadata_paths.py` rewrites them relative when a model is exported; this
//! test reads every doc string and metadata value of every model under `models/` (model,
//! graph, node, attribute, tensor, value info, function) and fails on an absolute path.

mod common;

use common::shipped_models;

use attnrt_onnx::proto::{
    AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto, StringStringEntryProto,
    TensorProto, ValueInfoProto,
};
use attnrt_onnx::{decode_model, Limits};

/// A byte of a path component: what `[\w.+@-]` matches in `models/metadata_paths.py` (any
/// non-ASCII byte counts as a word character).
fn is_name_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'+' | b'@' | b'-') || c >= 0x80
}

/// The first absolute path in `text`, by the rule of `models/metadata_paths.py`: a POSIX path
/// of two components or more (`/a/b`) that does not continue a word, a relative path or a URL
/// (`https://host/a/b`), or a Windows drive path (`C:\a`).
fn absolute_path(text: &str) -> Option<&str> {
    let b = text.as_bytes();
    for i in 0..b.len() {
        let before = i.checked_sub(1).map(|j| b[j]);
        if b[i] == b'/' && !before.is_some_and(|c| is_name_byte(c) || b"~:/".contains(&c)) {
            let (end, components) = posix_path_end(b, i);
            if components >= 2 {
                return Some(&text[i..end]);
            }
        }
        let drive = b[i].is_ascii_alphabetic() && b[i + 1..].starts_with(b":\\");
        if drive
            && !before.is_some_and(is_name_byte)
            && b.get(i + 3).is_some_and(|&c| is_name_byte(c))
        {
            let end = (i + 3..b.len()).find(|&j| !is_name_byte(b[j]) && b[j] != b'\\');
            return Some(&text[i..end.unwrap_or(b.len())]);
        }
    }
    None
}

/// Where the run of `/component`s starting at `start` ends, and how many components it has.
fn posix_path_end(b: &[u8], start: usize) -> (usize, usize) {
    let (mut at, mut components) = (start, 0);
    while at < b.len() && b[at] == b'/' {
        let len = b[at + 1..].iter().take_while(|&&c| is_name_byte(c)).count();
        if len == 0 {
            break;
        }
        at += 1 + len;
        components += 1;
    }
    (at, components)
}

/// Every doc string and metadata value of a model, each with where it is.
#[derive(Default)]
struct Texts<'m> {
    found: Vec<(String, &'m str)>,
}

impl<'m> Texts<'m> {
    fn add(&mut self, at: &str, doc: &'m str, props: &'m [StringStringEntryProto]) {
        self.found.push((format!("{at} doc_string"), doc));
        for p in props {
            self.found
                .push((format!("{at} metadata {}", p.key), &p.value));
        }
    }

    fn model(&mut self, m: &'m ModelProto) {
        self.add("model", &m.doc_string, &m.metadata_props);
        if let Some(g) = &m.graph {
            self.graph(g, "graph");
        }
        for f in &m.functions {
            self.function(f);
        }
    }

    fn function(&mut self, f: &'m FunctionProto) {
        let at = format!("function {}", f.name);
        self.add(&at, &f.doc_string, &f.metadata_props);
        for v in &f.value_info {
            self.value_info(v, &at);
        }
        for n in &f.node {
            self.node(n, &at);
        }
    }

    fn graph(&mut self, g: &'m GraphProto, at: &str) {
        let at = format!("{at} {:?}", g.name);
        self.add(&at, &g.doc_string, &g.metadata_props);
        for t in &g.initializer {
            self.tensor(t, &at);
        }
        for t in g
            .sparse_initializer
            .iter()
            .filter_map(|s| s.values.as_ref())
        {
            self.tensor(t, &at);
        }
        for v in g.input.iter().chain(&g.output).chain(&g.value_info) {
            self.value_info(v, &at);
        }
        for n in &g.node {
            self.node(n, &at);
        }
    }

    fn node(&mut self, n: &'m NodeProto, at: &str) {
        let at = format!("{at} node {:?} ({})", n.name, n.op_type);
        self.add(&at, &n.doc_string, &n.metadata_props);
        for a in &n.attribute {
            self.attribute(a, &at);
        }
    }

    fn attribute(&mut self, a: &'m AttributeProto, at: &str) {
        let at = format!("{at} attribute {}", a.name);
        self.add(&at, &a.doc_string, &[]);
        for t in a.t.iter().chain(&a.tensors) {
            self.tensor(t, &at);
        }
        for g in a.g.iter().chain(&a.graphs) {
            self.graph(g, &at);
        }
    }

    fn tensor(&mut self, t: &'m TensorProto, at: &str) {
        self.add(
            &format!("{at} tensor {:?}", t.name),
            &t.doc_string,
            &t.metadata_props,
        );
    }

    fn value_info(&mut self, v: &'m ValueInfoProto, at: &str) {
        self.add(
            &format!("{at} value {:?}", v.name),
            &v.doc_string,
            &v.metadata_props,
        );
    }
}

#[test]
fn no_committed_model_names_a_directory() {
    let mut offenders = Vec::new();
    let mut values = 0;
    for path in shipped_models() {
        let bytes = std::fs::read(&path).unwrap();
        let what = path.display().to_string();
        let model = decode_model(&bytes, &what, &Limits::default()).unwrap();
        let mut texts = Texts::default();
        texts.model(&model);
        values += texts.found.len();
        for (at, text) in texts.found {
            if let Some(p) = absolute_path(text) {
                offenders.push(format!("{what}: {at}: {p}"));
            }
        }
    }
    // The dynamo exports carry thousands of metadata values: the walk must have reached them.
    assert!(
        values > 10_000,
        "only {values} doc strings and metadata values read"
    );
    assert!(
        offenders.is_empty(),
        "{} metadata values name an absolute path (run `python models/metadata_paths.py`), e.g.\n{}",
        offenders.len(),
        offenders[..offenders.len().min(10)].join("\n")
    );
}

#[test]
fn absolute_paths_are_told_from_relative_ones() {
    let found = [
        ("File \"/home/me/x.py\", line 3", "/home/me/x.py"),
        (
            "at /work/main/models/export.py:327",
            "/work/main/models/export.py",
        ),
        ("(/tmp/a)", "/tmp/a"),
        ("C:\\Users\\me\\m.py, line 1", "C:\\Users\\me\\m.py"),
    ];
    for (text, path) in found {
        assert_eq!(absolute_path(text), Some(path), "{text}");
    }
    let clean = [
        "File \"torch/nn/modules/linear.py\", line 125, in forward",
        "File \"models/export.py\", line 327",
        "see https://github.com/onnx/onnx/blob/main/docs/Operators.md",
        "_hook: _hook/sym_size_int_8: aten.sym_size.int",
        "x / y",
        "/usr",
        "ratio 3/4/5",
        "",
    ];
    for text in clean {
        assert_eq!(absolute_path(text), None, "{text}");
    }
}
