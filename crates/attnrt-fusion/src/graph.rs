//! A read-only view of one ONNX graph for matching: who produces and who consumes each
//! tensor, constant values (initializers and `Constant` nodes), graph outputs, and static
//! facts about shapes and small integer/float values found by a symbolic forward pass.
//!
//! Shapes are lists of [`Dim`]s: a dimension is a product of an integer and named symbols
//! (graph-input `dim_param`s), so `B·L·64 / (B·4·16) = L` can be proven for `Reshape` targets
//! with `-1`, and the dynamic `Shape→Gather→Unsqueeze→Concat` chains exporters emit evaluate to
//! symbolic vectors such as `[B, L, 4, 16]`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use attnrt_onnx::proto::tensor_proto::DataType;
use attnrt_onnx::{attr, tensor, GraphProto, NodeProto, TensorProto};

/// One tensor dimension: `coef · Π symᵉ`. Symbols stand for unknown positive sizes
/// (graph-input `dim_param`s, or a fresh name for an unnamed dimension).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dim {
    coef: i64,
    syms: BTreeMap<String, u32>,
}

impl Dim {
    /// A known size.
    pub fn known(v: i64) -> Dim {
        Dim {
            coef: v,
            syms: BTreeMap::new(),
        }
    }

    /// An unknown positive size called `name`.
    pub fn sym(name: &str) -> Dim {
        let mut syms = BTreeMap::new();
        syms.insert(name.to_string(), 1);
        Dim { coef: 1, syms }
    }

    /// The value, when it contains no symbol.
    pub fn as_known(&self) -> Option<i64> {
        self.syms.is_empty().then_some(self.coef)
    }

    /// `self · other`, `None` on overflow.
    pub fn mul(&self, other: &Dim) -> Option<Dim> {
        let mut syms = self.syms.clone();
        for (k, e) in &other.syms {
            *syms.entry(k.clone()).or_insert(0) += e;
        }
        Some(Dim {
            coef: self.coef.checked_mul(other.coef)?,
            syms,
        })
    }

    /// `self / other` when the division is exact (symbol exponents do not go negative and the
    /// coefficient divides).
    pub fn div_exact(&self, other: &Dim) -> Option<Dim> {
        if other.coef == 0 || self.coef % other.coef != 0 {
            return None;
        }
        let mut syms = self.syms.clone();
        for (k, e) in &other.syms {
            let have = syms.get_mut(k)?;
            if *have < *e {
                return None;
            }
            *have -= e;
            if *have == 0 {
                syms.remove(k);
            }
        }
        Some(Dim {
            coef: self.coef / other.coef,
            syms,
        })
    }

    /// The symbol's name when the dimension is exactly one named symbol (a graph `dim_param`,
    /// not a fresh name made up for an unnamed dimension).
    pub fn as_symbol(&self) -> Option<&str> {
        match (self.coef, self.syms.len()) {
            (1, 1) => self
                .syms
                .iter()
                .next()
                .filter(|(k, e)| **e == 1 && !k.contains('#'))
                .map(|(k, _)| k.as_str()),
            _ => None,
        }
    }

    /// Whether the dimension is a known constant equal to `v`.
    pub fn is(&self, v: i64) -> bool {
        self.as_known() == Some(v)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.coef != 1 || self.syms.is_empty() {
            parts.push(self.coef.to_string());
        }
        for (k, e) in &self.syms {
            parts.push(if *e == 1 {
                k.clone()
            } else {
                format!("{k}^{e}")
            });
        }
        write!(f, "{}", parts.join("·"))
    }
}

/// Formats a shape as `[B, L, 64]`.
pub fn shape_str(s: &[Dim]) -> String {
    format!(
        "[{}]",
        s.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The product of a list of dims.
pub fn product(dims: &[Dim]) -> Option<Dim> {
    dims.iter().try_fold(Dim::known(1), |acc, d| acc.mul(d))
}

/// A small tensor value known before run time (constants and shape computations).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Integers (possibly symbolic, e.g. the output of `Shape`), with the tensor's dims.
    Ints(Vec<i64>, Vec<Dim>),
    /// Floating point numbers, with the tensor's dims.
    Floats(Vec<i64>, Vec<f64>),
    /// Booleans, with the tensor's dims.
    Bools(Vec<i64>, Vec<bool>),
}

impl Value {
    fn dims(&self) -> &[i64] {
        match self {
            Value::Ints(d, _) | Value::Floats(d, _) | Value::Bools(d, _) => d,
        }
    }

    fn len(&self) -> usize {
        match self {
            Value::Ints(_, v) => v.len(),
            Value::Floats(_, v) => v.len(),
            Value::Bools(_, v) => v.len(),
        }
    }

    fn with_dims(&self, dims: Vec<i64>) -> Value {
        match self {
            Value::Ints(_, v) => Value::Ints(dims, v.clone()),
            Value::Floats(_, v) => Value::Floats(dims, v.clone()),
            Value::Bools(_, v) => Value::Bools(dims, v.clone()),
        }
    }

    /// The single float this value holds (any rank with one element).
    pub fn scalar_f64(&self) -> Option<f64> {
        match self {
            Value::Floats(_, v) if v.len() == 1 => Some(v[0]),
            Value::Ints(_, v) if v.len() == 1 => v[0].as_known().map(|x| x as f64),
            _ => None,
        }
    }

    /// The integers, when all of them are known.
    pub fn known_ints(&self) -> Option<Vec<i64>> {
        match self {
            Value::Ints(_, v) => v.iter().map(Dim::as_known).collect(),
            _ => None,
        }
    }
}

/// Largest constant (in elements) whose values the view keeps for reasoning.
const MAX_VALUE_ELEMENTS: usize = 1 << 16;

/// The view. Indices are positions in `graph.node`.
pub struct GraphView<'a> {
    /// The graph viewed.
    pub graph: &'a GraphProto,
    producer: HashMap<&'a str, usize>,
    consumers: HashMap<&'a str, Vec<usize>>,
    initializers: HashMap<&'a str, &'a TensorProto>,
    graph_outputs: HashSet<&'a str>,
    graph_inputs: HashSet<&'a str>,
    shapes: HashMap<String, Vec<Dim>>,
    values: HashMap<String, Value>,
    elem_types: HashMap<String, i32>,
}

impl<'a> GraphView<'a> {
    /// Builds the view and runs the symbolic forward pass over `order` (a topological order).
    pub fn new(graph: &'a GraphProto, order: &[usize]) -> GraphView<'a> {
        let mut producer = HashMap::new();
        let mut consumers: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, n) in graph.node.iter().enumerate() {
            for o in n.output.iter().filter(|o| !o.is_empty()) {
                producer.insert(o.as_str(), i);
            }
            for inp in n.input.iter().filter(|o| !o.is_empty()) {
                let c = consumers.entry(inp.as_str()).or_default();
                if c.last() != Some(&i) {
                    c.push(i);
                }
            }
        }
        let initializers = graph
            .initializer
            .iter()
            .map(|t| (t.name.as_str(), t))
            .collect();
        let graph_outputs = graph.output.iter().map(|o| o.name.as_str()).collect();
        let graph_inputs = graph.input.iter().map(|o| o.name.as_str()).collect();
        let mut view = GraphView {
            graph,
            producer,
            consumers,
            initializers,
            graph_outputs,
            graph_inputs,
            shapes: HashMap::new(),
            values: HashMap::new(),
            elem_types: HashMap::new(),
        };
        view.infer(order);
        view
    }

    /// The node at `idx`.
    pub fn node(&self, idx: usize) -> &'a NodeProto {
        &self.graph.node[idx]
    }

    /// The index of the node producing `tensor`.
    pub fn producer(&self, tensor: &str) -> Option<usize> {
        self.producer.get(tensor).copied()
    }

    /// The nodes reading `tensor` (each once, in graph order).
    pub fn consumers(&self, tensor: &str) -> &[usize] {
        self.consumers.get(tensor).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Whether `tensor` is a graph output.
    pub fn is_graph_output(&self, tensor: &str) -> bool {
        self.graph_outputs.contains(tensor)
    }

    /// Whether `tensor` is a graph input that is not also an initializer.
    pub fn is_graph_input(&self, tensor: &str) -> bool {
        self.graph_inputs.contains(tensor) && !self.initializers.contains_key(tensor)
    }

    /// The initializer called `tensor`.
    pub fn initializer(&self, tensor: &str) -> Option<&'a TensorProto> {
        self.initializers.get(tensor).copied()
    }

    /// The static shape facts known for `tensor`.
    pub fn shape(&self, tensor: &str) -> Option<&[Dim]> {
        self.shapes.get(tensor).map(Vec::as_slice)
    }

    /// The rank of `tensor`, when known.
    pub fn rank(&self, tensor: &str) -> Option<usize> {
        self.shape(tensor).map(<[Dim]>::len)
    }

    /// The value of `tensor` known before run time (constant or computed from shapes).
    pub fn value(&self, tensor: &str) -> Option<&Value> {
        self.values.get(tensor)
    }

    /// The element type (`DataType` as i32) of `tensor`, when known.
    pub fn elem_type(&self, tensor: &str) -> Option<i32> {
        self.elem_types.get(tensor).copied()
    }

    /// Whether `tensor`'s value is fixed in the model file (initializer or a `Constant` node),
    /// as opposed to computed from run-time shapes.
    pub fn is_constant(&self, tensor: &str) -> bool {
        if self.initializers.contains_key(tensor) && !self.graph_inputs.contains(tensor) {
            return true;
        }
        matches!(
            self.producer(tensor).map(|p| self.node(p).op_type.as_str()),
            Some("Constant")
        )
    }

    // ---- the symbolic forward pass -------------------------------------------------------

    fn infer(&mut self, order: &[usize]) {
        let g = self.graph;
        for vi in g
            .input
            .iter()
            .chain(g.value_info.iter())
            .chain(g.output.iter())
        {
            if let Some(t) = vi.r#type.as_ref().and_then(|t| match &t.value {
                Some(attnrt_onnx::proto::type_proto::Value::TensorType(tt)) => Some(tt),
                _ => None,
            }) {
                self.elem_types.insert(vi.name.clone(), t.elem_type);
            }
        }
        // Graph inputs: value_info shapes; unnamed dims get a fresh symbol.
        for vi in &g.input {
            if let Some(s) = value_info_shape(vi) {
                self.shapes.insert(vi.name.clone(), s);
            }
        }
        for t in &g.initializer {
            self.shapes.insert(
                t.name.clone(),
                t.dims.iter().map(|&d| Dim::known(d)).collect(),
            );
            self.elem_types.insert(t.name.clone(), t.data_type);
            if let Some(v) = tensor_value(t) {
                self.values.insert(t.name.clone(), v);
            }
        }
        // Declared shapes of intermediates, used only when inference cannot say more.
        let declared: HashMap<&str, Vec<Dim>> = g
            .value_info
            .iter()
            .chain(g.output.iter())
            .filter_map(|vi| value_info_shape(vi).map(|s| (vi.name.as_str(), s)))
            .collect();
        for &idx in order {
            let n = &g.node[idx];
            self.infer_node(n);
            for o in &n.output {
                if !self.shapes.contains_key(o) {
                    if let Some(s) = declared.get(o.as_str()) {
                        self.shapes.insert(o.clone(), s.clone());
                    }
                }
            }
        }
    }

    fn in_shape(&self, n: &NodeProto, i: usize) -> Option<Vec<Dim>> {
        n.input
            .get(i)
            .filter(|s| !s.is_empty())
            .and_then(|t| self.shapes.get(t))
            .cloned()
    }

    fn in_value(&self, n: &NodeProto, i: usize) -> Option<&Value> {
        n.input
            .get(i)
            .filter(|s| !s.is_empty())
            .and_then(|t| self.values.get(t))
    }

    fn set(&mut self, n: &NodeProto, i: usize, shape: Option<Vec<Dim>>, value: Option<Value>) {
        let Some(name) = n.output.get(i).filter(|s| !s.is_empty()) else {
            return;
        };
        if let Some(s) = shape {
            self.shapes.insert(name.clone(), s);
        }
        if let Some(v) = value {
            if !self.shapes.contains_key(name) {
                self.shapes.insert(
                    name.clone(),
                    v.dims().iter().map(|&d| Dim::known(d)).collect(),
                );
            }
            self.values.insert(name.clone(), v);
        }
    }

    fn infer_node(&mut self, n: &NodeProto) {
        if !attnrt_onnx::opset::is_default_domain(&n.domain) {
            return;
        }
        let s0 = self.in_shape(n, 0);
        match n.op_type.as_str() {
            "Constant" => {
                let v = attr::tensor(n, "value")
                    .ok()
                    .flatten()
                    .and_then(tensor_value)
                    .or_else(|| {
                        if let Ok(Some(f)) = attr::float(n, "value_float") {
                            Some(Value::Floats(vec![], vec![f as f64]))
                        } else if let Ok(Some(i)) = attr::int(n, "value_int") {
                            Some(Value::Ints(vec![], vec![Dim::known(i)]))
                        } else if let Ok(Some(is)) = attr::ints(n, "value_ints") {
                            Some(Value::Ints(
                                vec![is.len() as i64],
                                is.iter().map(|&i| Dim::known(i)).collect(),
                            ))
                        } else {
                            None
                        }
                    });
                if let Ok(Some(t)) = attr::tensor(n, "value") {
                    if let Some(o) = n.output.first() {
                        self.elem_types.insert(o.clone(), t.data_type);
                    }
                    self.set(
                        n,
                        0,
                        Some(t.dims.iter().map(|&d| Dim::known(d)).collect()),
                        v,
                    );
                } else {
                    self.set(n, 0, None, v);
                }
            }
            "Identity" => {
                let v = self.in_value(n, 0).cloned();
                self.copy_type(n);
                self.set(n, 0, s0, v);
            }
            "Shape" => {
                let Some(s) = s0 else { return };
                let r = s.len() as i64;
                let norm = |x: i64| if x < 0 { (x + r).clamp(0, r) } else { x.min(r) };
                let start = norm(attr::int(n, "start").ok().flatten().unwrap_or(0));
                let end = norm(attr::int(n, "end").ok().flatten().unwrap_or(r));
                let dims: Vec<Dim> = if start < end {
                    s[start as usize..end as usize].to_vec()
                } else {
                    vec![]
                };
                self.set(n, 0, None, Some(Value::Ints(vec![dims.len() as i64], dims)));
            }
            "Cast" => {
                let to = attr::int(n, "to").ok().flatten().unwrap_or(0) as i32;
                if let Some(o) = n.output.first() {
                    self.elem_types.insert(o.clone(), to);
                }
                let v = self.in_value(n, 0).and_then(|v| cast_value(v, to));
                self.set(n, 0, s0, v);
            }
            "Softmax"
            | "Sqrt"
            | "Relu"
            | "Erf"
            | "Neg"
            | "Not"
            | "IsNaN"
            | "IsInf"
            | "Tanh"
            | "Sigmoid"
            | "Exp"
            | "Log"
            | "Reciprocal"
            | "Abs"
            | "Gelu"
            | "LayerNormalization"
            | "Dropout"
            | "Clip"
            | "BatchNormalization"
            | "Softplus"
            | "HardSigmoid"
            | "Trilu"
            | "Floor"
            | "Ceil"
            | "Round"
            | "Sign"
            | "Sin"
            | "Cos"
            | "InstanceNormalization"
            | "RMSNormalization"
            | "LogSoftmax"
            | "Elu"
            | "LeakyRelu"
            | "Mish"
            | "HardSwish" => {
                let v = match (n.op_type.as_str(), self.in_value(n, 0)) {
                    ("Sqrt", Some(Value::Floats(d, v))) => Some(Value::Floats(
                        d.clone(),
                        v.iter().map(|x| x.sqrt()).collect(),
                    )),
                    ("Reciprocal", Some(Value::Floats(d, v))) => Some(Value::Floats(
                        d.clone(),
                        v.iter().map(|x| 1.0 / x).collect(),
                    )),
                    ("Neg", Some(Value::Floats(d, v))) => {
                        Some(Value::Floats(d.clone(), v.iter().map(|x| -x).collect()))
                    }
                    // The ONNX expansions compute their GQA repeat count through Not/And.
                    ("Not", Some(Value::Bools(d, v))) => {
                        Some(Value::Bools(d.clone(), v.iter().map(|x| !x).collect()))
                    }
                    _ => None,
                };
                if matches!(n.op_type.as_str(), "Not" | "IsNaN" | "IsInf") {
                    if let Some(o) = n.output.first() {
                        self.elem_types.insert(o.clone(), DataType::Bool as i32);
                    }
                } else if let Some(t) = n
                    .input
                    .first()
                    .and_then(|i| self.elem_types.get(i))
                    .copied()
                {
                    if let Some(o) = n.output.first() {
                        self.elem_types.insert(o.clone(), t);
                    }
                }
                self.set(n, 0, s0, v);
            }
            "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "Equal" | "Less" | "Greater"
            | "And" | "Or" | "Where" | "Max" | "Min" | "GreaterOrEqual" | "LessOrEqual" | "Xor"
            | "BitwiseAnd" | "BitwiseOr" => {
                let shapes: Option<Vec<Vec<Dim>>> =
                    (0..n.input.len()).map(|i| self.in_shape(n, i)).collect();
                let shape = shapes.and_then(|s| broadcast_all(&s));
                let vals: Option<Vec<&Value>> =
                    (0..n.input.len()).map(|i| self.in_value(n, i)).collect();
                let v = vals.and_then(|v| eval_elementwise(&n.op_type, &v));
                let ty = if matches!(
                    n.op_type.as_str(),
                    "Equal"
                        | "Less"
                        | "Greater"
                        | "And"
                        | "Or"
                        | "GreaterOrEqual"
                        | "LessOrEqual"
                        | "Xor"
                ) {
                    Some(DataType::Bool as i32)
                } else {
                    let first = if n.op_type == "Where" { 1 } else { 0 };
                    n.input
                        .get(first)
                        .and_then(|i| self.elem_types.get(i))
                        .copied()
                };
                if let (Some(t), Some(o)) = (ty, n.output.first()) {
                    self.elem_types.insert(o.clone(), t);
                }
                self.set(n, 0, shape, v);
            }
            "MatMul" => {
                let (Some(a), Some(b)) = (s0, self.in_shape(n, 1)) else {
                    return;
                };
                if a.len() < 2 || b.len() < 2 {
                    return;
                }
                let batch = broadcast(&a[..a.len() - 2], &b[..b.len() - 2]);
                if let Some(mut s) = batch {
                    s.push(a[a.len() - 2].clone());
                    s.push(b[b.len() - 1].clone());
                    self.copy_type(n);
                    self.set(n, 0, Some(s), None);
                }
            }
            "Gemm" => {
                let (Some(a), Some(b)) = (s0, self.in_shape(n, 1)) else {
                    return;
                };
                if a.len() != 2 || b.len() != 2 {
                    return;
                }
                let ta = attr::int(n, "transA").ok().flatten().unwrap_or(0) != 0;
                let tb = attr::int(n, "transB").ok().flatten().unwrap_or(0) != 0;
                let m = if ta { a[1].clone() } else { a[0].clone() };
                let nn = if tb { b[0].clone() } else { b[1].clone() };
                self.copy_type(n);
                self.set(n, 0, Some(vec![m, nn]), None);
            }
            "Transpose" => {
                let Some(s) = s0 else { return };
                let perm: Vec<i64> = match attr::ints(n, "perm").ok().flatten() {
                    Some(p) => p.to_vec(),
                    None => (0..s.len() as i64).rev().collect(),
                };
                if !is_perm(&perm, s.len()) {
                    return;
                }
                self.copy_type(n);
                self.set(
                    n,
                    0,
                    Some(perm.iter().map(|&p| s[p as usize].clone()).collect()),
                    None,
                );
            }
            "Reshape" => {
                let Some(target) = self.in_value(n, 1).cloned() else {
                    return;
                };
                let Value::Ints(_, target) = target else {
                    return;
                };
                let allowzero = attr::int(n, "allowzero").ok().flatten().unwrap_or(0) != 0;
                let out = s0
                    .as_deref()
                    .and_then(|s| reshape_dims(s, &target, allowzero))
                    .or_else(|| {
                        // Without the input shape, a target free of 0 and -1 is still the shape.
                        target
                            .iter()
                            .all(|d| d.as_known().is_none_or(|v| v > 0))
                            .then(|| target.clone())
                    });
                let v = self.in_value(n, 0).and_then(|v| {
                    let dims: Option<Vec<i64>> = out.as_ref()?.iter().map(Dim::as_known).collect();
                    Some(v.with_dims(dims?))
                });
                self.copy_type(n);
                self.set(n, 0, out, v);
            }
            "Unsqueeze" | "Squeeze" => {
                let axes: Option<Vec<i64>> = match attr::ints(n, "axes").ok().flatten() {
                    Some(a) => Some(a.to_vec()),
                    None => self.in_value(n, 1).and_then(Value::known_ints),
                };
                let Some(s) = s0 else { return };
                let out = if n.op_type == "Unsqueeze" {
                    axes.and_then(|a| unsqueeze_dims(&s, &a))
                } else {
                    match axes {
                        Some(a) => squeeze_dims(&s, &a),
                        None => Some(s.iter().filter(|d| !d.is(1)).cloned().collect()),
                    }
                };
                let v = self.in_value(n, 0).and_then(|v| {
                    let dims: Option<Vec<i64>> = out.as_ref()?.iter().map(Dim::as_known).collect();
                    Some(v.with_dims(dims?))
                });
                self.copy_type(n);
                self.set(n, 0, out, v);
            }
            "Concat" => {
                let Ok(Some(axis)) = attr::int(n, "axis") else {
                    return;
                };
                let vals: Option<Vec<&Value>> =
                    (0..n.input.len()).map(|i| self.in_value(n, i)).collect();
                if let Some(vals) = vals {
                    // Shape vectors: 1-D integer concatenation.
                    let mut out = Vec::new();
                    let mut ok = axis == 0 || axis == -1;
                    for v in &vals {
                        match v {
                            Value::Ints(d, x) if d.len() == 1 => out.extend(x.iter().cloned()),
                            _ => ok = false,
                        }
                    }
                    if ok {
                        self.copy_type(n);
                        self.set(n, 0, None, Some(Value::Ints(vec![out.len() as i64], out)));
                        return;
                    }
                }
                let shapes: Option<Vec<Vec<Dim>>> =
                    (0..n.input.len()).map(|i| self.in_shape(n, i)).collect();
                if let Some(shapes) = shapes {
                    if let Some(s) = concat_shape(&shapes, axis) {
                        self.copy_type(n);
                        self.set(n, 0, Some(s), None);
                    }
                }
            }
            "Gather" => {
                let axis = attr::int(n, "axis").ok().flatten().unwrap_or(0);
                let idx = self.in_value(n, 1).and_then(Value::known_ints);
                let idx_shape: Option<Vec<Dim>> = match self.in_value(n, 1) {
                    Some(v) => Some(v.dims().iter().map(|&d| Dim::known(d)).collect()),
                    None => self.in_shape(n, 1),
                };
                let Some(idx_shape) = idx_shape else { return };
                if let (Some(Value::Ints(d, x)), Some(idx)) = (self.in_value(n, 0), idx.as_ref()) {
                    let idx_dims: Vec<i64> = self
                        .in_value(n, 1)
                        .map(|v| v.dims().to_vec())
                        .unwrap_or_default();
                    if d.len() == 1 && axis == 0 {
                        let len = x.len() as i64;
                        let picked: Option<Vec<Dim>> = idx
                            .iter()
                            .map(|&i| {
                                let i = if i < 0 { i + len } else { i };
                                (0..len).contains(&i).then(|| x[i as usize].clone())
                            })
                            .collect();
                        if let Some(p) = picked {
                            self.set(n, 0, None, Some(Value::Ints(idx_dims, p)));
                        }
                        return;
                    }
                }
                let Some(s) = s0 else { return };
                let r = s.len() as i64;
                let axis = if axis < 0 { axis + r } else { axis };
                if !(0..r).contains(&axis) {
                    return;
                }
                let mut out: Vec<Dim> = s[..axis as usize].to_vec();
                out.extend(idx_shape.iter().cloned());
                out.extend(s[axis as usize + 1..].iter().cloned());
                self.copy_type(n);
                self.set(n, 0, Some(out), None);
            }
            "Slice" => self.infer_slice(n),
            "Pad" => {
                // Opset ≥ 11 takes pads (and, from 18, axes) as inputs; before, an attribute.
                let Some(s) = s0 else { return };
                let r = s.len() as i64;
                let pads: Option<Vec<i64>> = match attr::ints(n, "pads").ok().flatten() {
                    Some(p) => Some(p.to_vec()),
                    None => self.in_value(n, 1).and_then(Value::known_ints),
                };
                let Some(pads) = pads else { return };
                let axes: Vec<i64> = if n.input.len() > 3 && !n.input[3].is_empty() {
                    match self.in_value(n, 3).and_then(Value::known_ints) {
                        Some(a) => a,
                        None => return,
                    }
                } else {
                    (0..r).collect()
                };
                if pads.len() != 2 * axes.len() {
                    return;
                }
                let mut out = s.clone();
                for (k, &a) in axes.iter().enumerate() {
                    let a = if a < 0 { a + r } else { a };
                    if !(0..r).contains(&a) {
                        return;
                    }
                    let Some(add) = pads[k].checked_add(pads[k + axes.len()]) else {
                        return;
                    };
                    let d = &out[a as usize];
                    out[a as usize] = match d.as_known() {
                        Some(v) => match v.checked_add(add) {
                            Some(x) if x >= 0 => Dim::known(x),
                            _ => return,
                        },
                        None if add == 0 => d.clone(),
                        None => return,
                    };
                }
                self.copy_type(n);
                self.set(n, 0, Some(out), None);
            }
            "Attention" => {
                // The op this crate emits: needed so later blocks see shapes after a rewrite.
                let (Some(q), Some(v)) = (s0, self.in_shape(n, 2)) else {
                    return;
                };
                let out = match (q.len(), v.len()) {
                    (4, 4) => Some(vec![q[0].clone(), q[1].clone(), q[2].clone(), v[3].clone()]),
                    (3, 3) => {
                        let qh = attr::int(n, "q_num_heads").ok().flatten();
                        let kvh = attr::int(n, "kv_num_heads").ok().flatten();
                        match (qh, kvh) {
                            (Some(qh), Some(kvh)) if kvh > 0 => v[2]
                                .div_exact(&Dim::known(kvh))
                                .and_then(|dv| dv.mul(&Dim::known(qh)))
                                .map(|h| vec![q[0].clone(), q[1].clone(), h]),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                self.copy_type(n);
                self.set(n, 0, out, None);
            }
            "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL2"
            | "ReduceSumSquare" | "ReduceLogSumExp" => {
                let Some(s) = s0 else { return };
                let r = s.len() as i64;
                let keep = attr::int(n, "keepdims").ok().flatten().unwrap_or(1) != 0;
                let axes: Option<Vec<i64>> = match attr::ints(n, "axes").ok().flatten() {
                    Some(a) => Some(a.to_vec()),
                    None if n.input.len() > 1 && !n.input[1].is_empty() => {
                        self.in_value(n, 1).and_then(Value::known_ints)
                    }
                    None => Some((0..r).collect()),
                };
                let Some(axes) = axes else { return };
                let axes: Vec<i64> = axes
                    .iter()
                    .map(|&a| if a < 0 { a + r } else { a })
                    .collect();
                let out: Vec<Dim> = s
                    .iter()
                    .enumerate()
                    .filter_map(|(i, d)| {
                        if axes.contains(&(i as i64)) {
                            keep.then(|| Dim::known(1))
                        } else {
                            Some(d.clone())
                        }
                    })
                    .collect();
                self.copy_type(n);
                self.set(n, 0, Some(out), None);
            }
            "Conv" => {
                let (Some(x), Some(w)) = (s0, self.in_shape(n, 1)) else {
                    return;
                };
                if x.len() < 3 || w.len() != x.len() {
                    return;
                }
                let sp = x.len() - 2;
                let get = |name: &str, dflt: i64, len: usize| -> Vec<i64> {
                    attr::ints(n, name)
                        .ok()
                        .flatten()
                        .map(<[i64]>::to_vec)
                        .unwrap_or_else(|| vec![dflt; len])
                };
                let (strides, dil, pads) = (
                    get("strides", 1, sp),
                    get("dilations", 1, sp),
                    get("pads", 0, 2 * sp),
                );
                if attr::string(n, "auto_pad")
                    .ok()
                    .flatten()
                    .is_some_and(|a| a != "NOTSET")
                    || strides.len() != sp
                    || dil.len() != sp
                    || pads.len() != 2 * sp
                {
                    return;
                }
                let mut out = vec![x[0].clone(), w[0].clone()];
                for i in 0..sp {
                    let (Some(xi), Some(ki)) = (x[2 + i].as_known(), w[2 + i].as_known()) else {
                        return;
                    };
                    let eff = dil[i] * (ki - 1) + 1;
                    out.push(Dim::known(
                        (xi + pads[i] + pads[sp + i] - eff) / strides[i] + 1,
                    ));
                }
                self.copy_type(n);
                self.set(n, 0, Some(out), None);
            }
            "GatherElements" => {
                let s1 = self.in_shape(n, 1);
                self.copy_type(n);
                self.set(n, 0, s1, None);
            }
            "GatherND" => {
                let (Some(data), Some(idx)) = (s0, self.in_shape(n, 1)) else {
                    return;
                };
                let b = attr::int(n, "batch_dims").ok().flatten().unwrap_or(0) as usize;
                let Some(k) = idx.last().and_then(Dim::as_known) else {
                    return;
                };
                if idx.is_empty() || b + k as usize > data.len() {
                    return;
                }
                let mut out: Vec<Dim> = idx[..idx.len() - 1].to_vec();
                out.extend(data[b + k as usize..].iter().cloned());
                self.copy_type(n);
                self.set(n, 0, Some(out), None);
            }
            "Range" => {
                let get = |i: usize| {
                    self.in_value(n, i).and_then(|v| match v {
                        Value::Ints(_, x) if x.len() == 1 => Some(x[0].clone()),
                        _ => None,
                    })
                };
                let (Some(start), Some(limit), Some(delta)) = (get(0), get(1), get(2)) else {
                    return;
                };
                let len = match (start.as_known(), limit.as_known(), delta.as_known()) {
                    (Some(0), _, Some(1)) => limit,
                    (Some(a), Some(b), Some(d)) if d != 0 => {
                        Dim::known(((b - a + d - d.signum()) / d).max(0))
                    }
                    _ => return,
                };
                self.copy_type(n);
                self.set(n, 0, Some(vec![len]), None);
            }
            "Flatten" => {
                let Some(s) = s0 else { return };
                let r = s.len() as i64;
                let axis = attr::int(n, "axis").ok().flatten().unwrap_or(1);
                let axis = if axis < 0 { axis + r } else { axis };
                if !(0..=r).contains(&axis) {
                    return;
                }
                let (Some(a), Some(b)) =
                    (product(&s[..axis as usize]), product(&s[axis as usize..]))
                else {
                    return;
                };
                self.copy_type(n);
                self.set(n, 0, Some(vec![a, b]), None);
            }
            "Split" => {
                let Some(s) = s0 else { return };
                let r = s.len() as i64;
                let axis = attr::int(n, "axis").ok().flatten().unwrap_or(0);
                let axis = if axis < 0 { axis + r } else { axis };
                if !(0..r).contains(&axis) {
                    return;
                }
                let parts = n.output.len() as i64;
                let sizes: Option<Vec<i64>> = match attr::ints(n, "split").ok().flatten() {
                    Some(sp) => Some(sp.to_vec()),
                    None => match self.in_value(n, 1).and_then(Value::known_ints) {
                        Some(sp) => Some(sp),
                        None => s[axis as usize]
                            .as_known()
                            .filter(|&d| parts > 0 && d % parts == 0)
                            .map(|d| vec![d / parts; parts as usize]),
                    },
                };
                let Some(sizes) = sizes else { return };
                if sizes.len() != n.output.len() {
                    return;
                }
                for (i, sz) in sizes.iter().enumerate() {
                    let mut out = s.clone();
                    out[axis as usize] = Dim::known(*sz);
                    if let (Some(t), Some(o)) = (
                        n.input
                            .first()
                            .and_then(|i| self.elem_types.get(i))
                            .copied(),
                        n.output.get(i),
                    ) {
                        self.elem_types.insert(o.clone(), t);
                    }
                    self.set(n, i, Some(out), None);
                }
            }
            "Expand" => {
                let (Some(s), Some(Value::Ints(_, target))) = (s0, self.in_value(n, 1).cloned())
                else {
                    return;
                };
                let out = broadcast(&s, &target);
                self.copy_type(n);
                self.set(n, 0, out, None);
            }
            "ConstantOfShape" => {
                let fill_type = attr::tensor(n, "value")
                    .ok()
                    .flatten()
                    .map_or(DataType::Float as i32, |t| t.data_type);
                if let Some(o) = n.output.first() {
                    self.elem_types.insert(o.clone(), fill_type);
                }
                let Some(shape) = self.in_value(n, 0).and_then(Value::known_ints) else {
                    // A run-time shape: the dims are still known symbolically.
                    if let Some(Value::Ints(_, dims)) = self.in_value(n, 0).cloned() {
                        self.set(n, 0, Some(dims), None);
                    }
                    return;
                };
                // A hostile shape can overflow the product: then it is not a small value.
                let Some(count) =
                    shape.iter().try_fold(
                        1i64,
                        |acc, &d| if d < 0 { None } else { acc.checked_mul(d) },
                    )
                else {
                    return;
                };
                if count as usize > MAX_VALUE_ELEMENTS {
                    return;
                }
                let fill = attr::tensor(n, "value")
                    .ok()
                    .flatten()
                    .and_then(tensor_value);
                let v = match fill {
                    None => Some(Value::Floats(shape.clone(), vec![0.0; count as usize])),
                    Some(Value::Floats(_, f)) if f.len() == 1 => {
                        Some(Value::Floats(shape.clone(), vec![f[0]; count as usize]))
                    }
                    Some(Value::Ints(_, i)) if i.len() == 1 => Some(Value::Ints(
                        shape.clone(),
                        vec![i[0].clone(); count as usize],
                    )),
                    Some(Value::Bools(_, b)) if b.len() == 1 => {
                        Some(Value::Bools(shape.clone(), vec![b[0]; count as usize]))
                    }
                    _ => None,
                };
                self.set(
                    n,
                    0,
                    Some(shape.iter().map(|&d| Dim::known(d)).collect()),
                    v,
                );
            }
            _ => {}
        }
    }

    fn copy_type(&mut self, n: &NodeProto) {
        if let (Some(t), Some(o)) = (
            n.input
                .first()
                .and_then(|i| self.elem_types.get(i))
                .copied(),
            n.output.first(),
        ) {
            self.elem_types.insert(o.clone(), t);
        }
    }

    fn infer_slice(&mut self, n: &NodeProto) {
        let dims_of = |i: usize| match self.in_value(n, i) {
            Some(Value::Ints(_, x)) => Some(x.clone()),
            _ => None,
        };
        let get = |i: usize| self.in_value(n, i).and_then(Value::known_ints);
        let (Some(starts), Some(ends_sym)) = (get(1), dims_of(2)) else {
            return;
        };
        let axes = if n.input.len() > 3 && !n.input[3].is_empty() {
            get(3)
        } else {
            Some((0..starts.len() as i64).collect())
        };
        let steps = if n.input.len() > 4 && !n.input[4].is_empty() {
            get(4)
        } else {
            Some(vec![1; starts.len()])
        };
        let (Some(axes), Some(steps)) = (axes, steps) else {
            return;
        };
        if axes.len() != starts.len()
            || ends_sym.len() != starts.len()
            || steps.len() != starts.len()
            || steps.iter().any(|&s| s != 1)
        {
            return;
        }
        let ends_known: Option<Vec<i64>> = ends_sym.iter().map(Dim::as_known).collect();
        // A 1-D integer value (shape vector) sliced on axis 0.
        if let (Some(Value::Ints(d, x)), Some(ends)) =
            (self.in_value(n, 0).cloned(), ends_known.as_ref())
        {
            if d.len() == 1 && axes.len() == 1 && (axes[0] == 0 || axes[0] == -1) {
                let len = x.len() as i64;
                let (b, e) = slice_range(starts[0], ends[0], len);
                let v: Vec<Dim> = x[b as usize..e.max(b) as usize].to_vec();
                self.set(n, 0, None, Some(Value::Ints(vec![v.len() as i64], v)));
                return;
            }
        }
        let Some(mut s) = self.in_shape(n, 0) else {
            return;
        };
        let r = s.len() as i64;
        for (k, &ax) in axes.iter().enumerate() {
            let ax = if ax < 0 { ax + r } else { ax };
            if !(0..r).contains(&ax) {
                return;
            }
            let d = &s[ax as usize];
            let end = &ends_sym[k];
            if starts[k] == 0 && end.as_known().is_some_and(|e| e >= i64::MAX / 2) {
                continue;
            }
            if starts[k] == 0 && end.as_known().is_none() {
                // `x[:e]` with a run-time `e` (a causal buffer sliced to the sequence length):
                // the result has min(d, e) rows. It is taken as `e`: where e > d the original
                // graph fails at the first broadcast against an e-sized tensor anyway.
                if d == end || d.as_known().is_some() {
                    s[ax as usize] = end.clone();
                    continue;
                }
                return;
            }
            let (Some(len), Some(e)) = (d.as_known(), end.as_known()) else {
                return;
            };
            let (b, e) = slice_range(starts[k], e, len);
            s[ax as usize] = Dim::known((e - b).max(0));
        }
        self.copy_type(n);
        self.set(n, 0, Some(s), None);
    }
}

fn slice_range(start: i64, end: i64, len: i64) -> (i64, i64) {
    let norm = |x: i64| {
        if x < 0 {
            (x + len).clamp(0, len)
        } else {
            x.min(len)
        }
    };
    let (b, e) = (norm(start), norm(end));
    (b, e.max(b))
}

fn value_info_shape(vi: &attnrt_onnx::ValueInfoProto) -> Option<Vec<Dim>> {
    use attnrt_onnx::proto::tensor_shape_proto::dimension::Value as DV;
    let tt = match vi.r#type.as_ref()?.value.as_ref()? {
        attnrt_onnx::proto::type_proto::Value::TensorType(tt) => tt,
        _ => return None,
    };
    let shape = tt.shape.as_ref()?;
    Some(
        shape
            .dim
            .iter()
            .enumerate()
            .map(|(i, d)| match &d.value {
                Some(DV::DimValue(v)) => Dim::known(*v),
                Some(DV::DimParam(p)) if !p.is_empty() => Dim::sym(p),
                _ => Dim::sym(&format!("{}#{i}", vi.name)),
            })
            .collect(),
    )
}

/// The value of a small constant tensor.
pub fn tensor_value(t: &TensorProto) -> Option<Value> {
    tensor_value_limited(t, MAX_VALUE_ELEMENTS)
}

/// The value of a constant tensor of at most `limit` elements (stored in the file, not as
/// external data).
pub fn tensor_value_limited(t: &TensorProto, limit: usize) -> Option<Value> {
    let n = tensor::element_count(&t.dims, limit as u64).ok()? as usize;
    if n > limit || !t.external_data.is_empty() {
        return None;
    }
    let dims = t.dims.clone();
    let dt = DataType::try_from(t.data_type).ok()?;
    let v = match dt {
        DataType::Bool => Value::Bools(
            dims,
            tensor::to_i64(t)
                .ok()?
                .into_iter()
                .map(|x| x != 0)
                .collect(),
        ),
        DataType::Float | DataType::Double | DataType::Float16 | DataType::Bfloat16 => {
            Value::Floats(
                dims,
                tensor::to_f32(t)
                    .ok()?
                    .into_iter()
                    .map(|x| x as f64)
                    .collect(),
            )
        }
        _ => Value::Ints(
            dims,
            tensor::to_i64(t)
                .ok()?
                .into_iter()
                .map(Dim::known)
                .collect(),
        ),
    };
    (v.len() == n).then_some(v)
}

fn cast_value(v: &Value, to: i32) -> Option<Value> {
    let to = DataType::try_from(to).ok()?;
    let is_float = matches!(
        to,
        DataType::Float | DataType::Double | DataType::Float16 | DataType::Bfloat16
    );
    let is_int = matches!(
        to,
        DataType::Int64
            | DataType::Int32
            | DataType::Int16
            | DataType::Int8
            | DataType::Uint8
            | DataType::Uint16
            | DataType::Uint32
            | DataType::Uint64
    );
    match v {
        Value::Ints(d, x) if is_int => Some(Value::Ints(d.clone(), x.clone())),
        Value::Ints(d, x) if is_float => {
            let k: Option<Vec<f64>> = x.iter().map(|d| d.as_known().map(|v| v as f64)).collect();
            // Rounding to the target float type matters for exactness of later arithmetic.
            let k = k?
                .into_iter()
                .map(|v| {
                    if to == DataType::Float {
                        v as f32 as f64
                    } else {
                        v
                    }
                })
                .collect();
            Some(Value::Floats(d.clone(), k))
        }
        Value::Floats(d, x) if is_float => Some(Value::Floats(
            d.clone(),
            x.iter()
                .map(|&v| {
                    if to == DataType::Float {
                        v as f32 as f64
                    } else {
                        v
                    }
                })
                .collect(),
        )),
        Value::Floats(d, x) if is_int => Some(Value::Ints(
            d.clone(),
            x.iter().map(|&v| Dim::known(v.trunc() as i64)).collect(),
        )),
        Value::Bools(d, x) if to == DataType::Bool => Some(Value::Bools(d.clone(), x.clone())),
        _ => None,
    }
}

/// Elementwise arithmetic on known values; integer operands may be symbolic for Mul and exact
/// Div. Broadcasting is limited to equal lengths or one single-element operand.
fn eval_elementwise(op: &str, vals: &[&Value]) -> Option<Value> {
    let len = vals.iter().map(|v| v.len()).max()?;
    if vals.iter().any(|v| v.len() != len && v.len() != 1) {
        return None;
    }
    let dims = vals.iter().find(|v| v.len() == len)?.dims().to_vec();
    if vals.iter().any(|v| v.dims().len() > dims.len()) {
        return None;
    }
    let pick = |i: usize, k: usize| -> usize {
        if vals[k].len() == 1 {
            0
        } else {
            i
        }
    };
    match (op, vals) {
        (_, [Value::Bools(_, a), Value::Bools(_, b)]) => {
            let f = |x: bool, y: bool| -> Option<bool> {
                Some(match op {
                    "And" => x && y,
                    "Or" => x || y,
                    "Xor" | "BitwiseXor" => x != y,
                    "Equal" => x == y,
                    _ => return None,
                })
            };
            let out: Option<Vec<bool>> =
                (0..len).map(|i| f(a[pick(i, 0)], b[pick(i, 1)])).collect();
            Some(Value::Bools(dims, out?))
        }
        ("Where", [Value::Bools(_, c), a, b]) => {
            let mut out = Vec::new();
            for i in 0..len {
                let src = if c[pick(i, 0)] { a } else { b };
                out.push(match src {
                    Value::Ints(_, x) => Value::Ints(
                        vec![],
                        vec![x[pick(i, if c[pick(i, 0)] { 1 } else { 2 })].clone()],
                    ),
                    Value::Floats(_, x) => {
                        Value::Floats(vec![], vec![x[pick(i, if c[pick(i, 0)] { 1 } else { 2 })]])
                    }
                    _ => return None,
                });
            }
            if out.iter().all(|v| matches!(v, Value::Ints(..))) {
                Some(Value::Ints(
                    dims,
                    out.into_iter()
                        .map(|v| {
                            if let Value::Ints(_, mut x) = v {
                                x.remove(0)
                            } else {
                                unreachable!()
                            }
                        })
                        .collect(),
                ))
            } else if out.iter().all(|v| matches!(v, Value::Floats(..))) {
                Some(Value::Floats(
                    dims,
                    out.into_iter()
                        .map(|v| {
                            if let Value::Floats(_, x) = v {
                                x[0]
                            } else {
                                unreachable!()
                            }
                        })
                        .collect(),
                ))
            } else {
                None
            }
        }
        (_, [Value::Ints(_, a), Value::Ints(_, b)]) => {
            let mut ints = Vec::new();
            let mut bools = Vec::new();
            for i in 0..len {
                let (x, y) = (&a[pick(i, 0)], &b[pick(i, 1)]);
                match op {
                    "Mul" => ints.push(x.mul(y)?),
                    "Div" => match (x.as_known(), y.as_known()) {
                        // ONNX integer Div truncates.
                        (Some(p), Some(q)) if q != 0 => ints.push(Dim::known(p / q)),
                        _ => ints.push(x.div_exact(y)?),
                    },
                    "Add" => ints.push(Dim::known(x.as_known()?.checked_add(y.as_known()?)?)),
                    "Sub" => ints.push(Dim::known(x.as_known()?.checked_sub(y.as_known()?)?)),
                    "Mod" => {
                        let (p, q) = (x.as_known()?, y.as_known()?);
                        if q == 0 {
                            return None;
                        }
                        ints.push(Dim::known(p.rem_euclid(q)));
                    }
                    "Equal" => bools.push(match (x.as_known(), y.as_known()) {
                        (Some(p), Some(q)) => p == q,
                        // Symbols are positive sizes: never equal to a non-positive constant.
                        (None, Some(q)) | (Some(q), None) if q <= 0 => false,
                        _ if x == y => true,
                        _ => return None,
                    }),
                    _ => return None,
                }
            }
            if op == "Equal" {
                Some(Value::Bools(dims, bools))
            } else {
                Some(Value::Ints(dims, ints))
            }
        }
        (_, [Value::Floats(_, a), Value::Floats(_, b)]) => {
            let f = |x: f64, y: f64| -> Option<f64> {
                Some(match op {
                    "Mul" => x * y,
                    "Div" => x / y,
                    "Add" => x + y,
                    "Sub" => x - y,
                    "Pow" => x.powf(y),
                    _ => return None,
                })
            };
            let out: Option<Vec<f64>> = (0..len).map(|i| f(a[pick(i, 0)], b[pick(i, 1)])).collect();
            Some(Value::Floats(dims, out?))
        }
        _ => None,
    }
}

fn is_perm(perm: &[i64], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    perm.len() == rank
        && perm.iter().all(|&p| {
            (0..rank as i64).contains(&p) && !std::mem::replace(&mut seen[p as usize], true)
        })
}

/// Numpy-style broadcast of two shapes; `None` when it cannot be proven (two different
/// symbols, or two different known sizes).
pub fn broadcast(a: &[Dim], b: &[Dim]) -> Option<Vec<Dim>> {
    let r = a.len().max(b.len());
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        let x = (i + a.len()).checked_sub(r).map(|j| &a[j]);
        let y = (i + b.len()).checked_sub(r).map(|j| &b[j]);
        out.push(match (x, y) {
            (Some(x), None) => x.clone(),
            (None, Some(y)) => y.clone(),
            (Some(x), Some(y)) if x == y => x.clone(),
            (Some(x), Some(y)) if x.is(1) => y.clone(),
            (Some(x), Some(y)) if y.is(1) => x.clone(),
            // A symbol broadcast against a known size > 1 must equal it (or the op fails).
            (Some(x), Some(y)) if x.as_known().is_none() && y.as_known().is_some() => y.clone(),
            (Some(x), Some(y)) if y.as_known().is_none() && x.as_known().is_some() => x.clone(),
            _ => return None,
        });
    }
    Some(out)
}

fn broadcast_all(shapes: &[Vec<Dim>]) -> Option<Vec<Dim>> {
    let mut it = shapes.iter();
    let first = it.next()?.clone();
    it.try_fold(first, |acc, s| broadcast(&acc, s))
}

fn reshape_dims(input: &[Dim], target: &[Dim], allowzero: bool) -> Option<Vec<Dim>> {
    let mut out: Vec<Option<Dim>> = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, t) in target.iter().enumerate() {
        match t.as_known() {
            Some(0) if !allowzero => out.push(Some(input.get(i)?.clone())),
            Some(-1) => {
                if infer_at.replace(i).is_some() {
                    return None;
                }
                out.push(None);
            }
            Some(v) if v < 0 => return None,
            _ => out.push(Some(t.clone())),
        }
    }
    if let Some(at) = infer_at {
        let known: Vec<Dim> = out.iter().flatten().cloned().collect();
        let d = product(input)?.div_exact(&product(&known)?)?;
        out[at] = Some(d);
    }
    out.into_iter().collect()
}

fn unsqueeze_dims(s: &[Dim], axes: &[i64]) -> Option<Vec<Dim>> {
    let r = (s.len() + axes.len()) as i64;
    let mut axes: Vec<i64> = axes
        .iter()
        .map(|&a| if a < 0 { a + r } else { a })
        .collect();
    axes.sort_unstable();
    if axes.iter().any(|&a| !(0..r).contains(&a)) || axes.windows(2).any(|w| w[0] == w[1]) {
        return None;
    }
    let mut it = s.iter();
    (0..r)
        .map(|i| {
            if axes.contains(&i) {
                Some(Dim::known(1))
            } else {
                it.next().cloned()
            }
        })
        .collect()
}

fn squeeze_dims(s: &[Dim], axes: &[i64]) -> Option<Vec<Dim>> {
    let r = s.len() as i64;
    let axes: Vec<i64> = axes
        .iter()
        .map(|&a| if a < 0 { a + r } else { a })
        .collect();
    if axes
        .iter()
        .any(|&a| !(0..r).contains(&a) || !s[a as usize].is(1))
    {
        return None;
    }
    Some(
        s.iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(&(*i as i64)))
            .map(|(_, d)| d.clone())
            .collect(),
    )
}

fn concat_shape(shapes: &[Vec<Dim>], axis: i64) -> Option<Vec<Dim>> {
    let first = shapes.first()?;
    let r = first.len() as i64;
    let axis = if axis < 0 { axis + r } else { axis };
    if !(0..r).contains(&axis) {
        return None;
    }
    let mut total = 0i64;
    for s in shapes {
        if s.len() != first.len() {
            return None;
        }
        for (i, d) in s.iter().enumerate() {
            if i as i64 != axis && d != &first[i] {
                return None;
            }
        }
        total += s[axis as usize].as_known()?;
    }
    let mut out = first.clone();
    out[axis as usize] = Dim::known(total);
    Some(out)
}
