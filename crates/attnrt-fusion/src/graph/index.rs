//! Who makes and who reads each tensor of one ONNX graph, its graph inputs and outputs, and
//! its constants (initializers and `Constant` nodes): built in one pass over the nodes, with no
//! inference. [`GraphView`](super::GraphView) adds the symbolic forward pass's facts to it;
//! the generation's graph checks use it alone.

use std::collections::{HashMap, HashSet};

use attnrt_onnx::{GraphProto, NodeProto, TensorProto, ValueInfoProto};

/// The index. Indices are positions in `graph.node`, and for the nodes of subgraphs (in an
/// index [`with_subgraphs`](GraphIndex::with_subgraphs)) positions after them.
pub struct GraphIndex<'a> {
    /// The graph indexed.
    pub graph: &'a GraphProto,
    nodes: Vec<&'a NodeProto>,
    /// For each subgraph node (`nodes[graph.node.len() + k]`), the graph's node holding it and
    /// that node's attribute (`then_branch`) it is in, at any depth.
    holders: Vec<(usize, &'a str)>,
    producer: HashMap<&'a str, usize>,
    consumers: HashMap<&'a str, Vec<usize>>,
    initializers: HashMap<&'a str, &'a TensorProto>,
    graph_outputs: HashSet<&'a str>,
    graph_inputs: HashSet<&'a str>,
}

impl<'a> GraphIndex<'a> {
    /// The index of the nodes of `graph` (its subgraphs' nodes are not read).
    pub fn new(graph: &'a GraphProto) -> GraphIndex<'a> {
        GraphIndex::build(graph, false)
    }

    /// The index of `graph` in which a subgraph's nodes (of `If`, `Loop`, `Scan`, at any depth)
    /// are readers too: they read a tensor of the graph by its name alone, without it among the
    /// inputs of the node that holds them ([`holder`](GraphIndex::holder) says which). Producers
    /// are the graph's own nodes (a subgraph's outputs are its own); a subgraph's name that
    /// shadows one of the graph's is not told apart (it counts as a reader: the safe side).
    pub fn with_subgraphs(graph: &'a GraphProto) -> GraphIndex<'a> {
        GraphIndex::build(graph, true)
    }

    fn build(graph: &'a GraphProto, subgraphs: bool) -> GraphIndex<'a> {
        let names = |v: &'a [ValueInfoProto]| v.iter().map(|v| v.name.as_str()).collect();
        let initializers = graph.initializer.iter().map(|t| (t.name.as_str(), t));
        let mut index = GraphIndex {
            graph,
            nodes: graph.node.iter().collect(),
            holders: Vec::new(),
            producer: HashMap::new(),
            consumers: HashMap::new(),
            initializers: initializers.collect(),
            graph_outputs: names(&graph.output),
            graph_inputs: names(&graph.input),
        };
        for (i, n) in graph.node.iter().enumerate() {
            for o in n.output.iter().filter(|o| !o.is_empty()) {
                index.producer.insert(o.as_str(), i);
            }
            index.add_reader(i, n);
            if subgraphs {
                index.add_subgraphs(n, i, None);
            }
        }
        index
    }

    /// Records `n` (numbered `i`) as the reader of its inputs.
    fn add_reader(&mut self, i: usize, n: &'a NodeProto) {
        for inp in n.input.iter().filter(|o| !o.is_empty()) {
            let c = self.consumers.entry(inp.as_str()).or_default();
            if c.last() != Some(&i) {
                c.push(i);
            }
        }
    }

    /// Records the nodes of `n`'s subgraphs as readers, numbered from the end of `nodes`,
    /// depth first; `at` is the graph's node holding them, in its attribute `branch` (`None`:
    /// `n` is that node, and each attribute names its own).
    fn add_subgraphs(&mut self, n: &'a NodeProto, at: usize, branch: Option<&'a str>) {
        for a in &n.attribute {
            let branch = branch.unwrap_or(a.name.as_str());
            for inner in a.g.iter().chain(&a.graphs).flat_map(|g| &g.node) {
                self.nodes.push(inner);
                self.holders.push((at, branch));
                self.add_reader(self.nodes.len() - 1, inner);
                self.add_subgraphs(inner, at, Some(branch));
            }
        }
    }

    /// The node at `idx`.
    pub fn node(&self, idx: usize) -> &'a NodeProto {
        self.nodes[idx]
    }

    /// For a node of a subgraph (in an index [`with_subgraphs`](GraphIndex::with_subgraphs)),
    /// the graph's node holding it and the attribute (`then_branch`) it is in; `None` for the
    /// graph's own nodes.
    pub fn holder(&self, idx: usize) -> Option<(usize, &'a str)> {
        let k = idx.checked_sub(self.graph.node.len())?;
        self.holders.get(k).copied()
    }

    /// The node at `idx` as messages name it: its label, and for a node of a subgraph where it
    /// is (`Neg_0 (in then_branch of If_3)`).
    pub fn label(&self, idx: usize) -> String {
        let name = attnrt_onnx::node_label(self.nodes[idx]);
        match self.holder(idx) {
            Some((at, branch)) => {
                let holder = attnrt_onnx::node_label(self.nodes[at]);
                format!("{name} (in {branch} of {holder})")
            }
            None => name,
        }
    }

    /// The index of the node producing `tensor`.
    pub fn producer(&self, tensor: &str) -> Option<usize> {
        self.producer.get(tensor).copied()
    }

    /// The node producing `tensor`.
    pub fn producer_node(&self, tensor: &str) -> Option<&'a NodeProto> {
        self.producer(tensor).map(|p| self.nodes[p])
    }

    /// The nodes reading `tensor` (each once, in graph order; a subgraph's nodes right after
    /// the node holding it).
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

    /// Whether `tensor`'s value is fixed in the model file (initializer or a `Constant` node),
    /// as opposed to computed from run-time shapes. An initializer that is also a graph input
    /// is not: the caller may feed it.
    pub fn is_constant(&self, tensor: &str) -> bool {
        if self.initializers.contains_key(tensor) && !self.graph_inputs.contains(tensor) {
            return true;
        }
        self.constant_node(tensor).is_some()
    }

    /// The `Constant` node producing `tensor`.
    pub fn constant_node(&self, tensor: &str) -> Option<&'a NodeProto> {
        self.producer_node(tensor)
            .filter(|n| n.op_type == "Constant")
    }

    /// The tensor written in the model file for `tensor`: the `value` of the `Constant` node
    /// producing it, else the initializer of that name (also one that is a graph input: ask
    /// [`is_constant`](GraphIndex::is_constant) where the caller's feed matters).
    pub fn constant(&self, tensor: &str) -> Option<&'a TensorProto> {
        match self.constant_node(tensor) {
            Some(n) => attnrt_onnx::attr::tensor(n, "value").ok().flatten(),
            None => self.initializer(tensor),
        }
    }

    /// The dims and values of `tensor` when it is a [`constant`](GraphIndex::constant) of at
    /// most eight integers (or values that convert to them): axes, indices, shapes.
    pub fn small_ints(&self, tensor: &str) -> Option<(&'a [i64], Vec<i64>)> {
        let t = self
            .constant(tensor)
            .filter(|t| t.dims.iter().product::<i64>() <= 8)?;
        let values = attnrt_onnx::tensor::to_i64(t).ok()?;
        Some((&t.dims, values))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnrt_onnx::attr::{make_ints, make_tensor};
    use attnrt_onnx::proto::attribute_proto::AttributeType;
    use attnrt_onnx::AttributeProto;
    use attnrt_onnx::DataType;
    use attnrt_testkit::{node, node_with_attrs, tensor_f32, tensor_i64, value_info, GraphBuilder};

    fn graph_attr(name: &str, g: GraphProto) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: AttributeType::Graph as i32,
            g: Some(g),
            ..Default::default()
        }
    }

    /// `y = Add(Shape(x)[axes], w)` beside an `If` whose branch reads `x` by name alone, and
    /// `d` in the body of a `Loop` inside it; `axes` a `Constant`, `w` an initializer also fed
    /// as an input, `big` an initializer of 9 ints.
    fn graph() -> GraphProto {
        let mut body = GraphBuilder::new("body");
        body.node(node("deep", "Neg", &["d"], &["e"]));
        let mut branch = GraphBuilder::new("branch");
        branch.node(node("inner", "Neg", &["x"], &["z"]));
        let body = graph_attr("body", body.finish());
        branch.node(node_with_attrs("loop", "Loop", &[], &["l"], vec![body]));
        let mut g = GraphBuilder::new("g");
        g.input(value_info("x", DataType::Float, &[2, 3]));
        g.input(value_info("w", DataType::Int64, &[1]));
        g.initializer(tensor_i64("w", &[1], &[1]));
        g.initializer(tensor_i64("big", &[9], &[0; 9]));
        g.initializer(tensor_f32("f", &[], &[2.0]));
        let axes = make_tensor("value", tensor_i64("", &[1], &[0]));
        g.node(node_with_attrs(
            "axes",
            "Constant",
            &[],
            &["axes"],
            vec![axes],
        ));
        let list = make_ints("value_ints", &[0, 1]);
        g.node(node_with_attrs(
            "list",
            "Constant",
            &[],
            &["list"],
            vec![list],
        ));
        g.node(node("shape", "Shape", &["x"], &["s"]));
        g.node(node("gather", "Gather", &["s", "axes"], &["d"]));
        g.node(node("add", "Add", &["d", "d"], &["y"]));
        let then = graph_attr("then_branch", branch.finish());
        g.node(node_with_attrs("if", "If", &["c"], &["o"], vec![then]));
        g.output(value_info("y", DataType::Int64, &[1]));
        g.finish()
    }

    #[test]
    fn producers_and_readers_are_indexed_once_a_node() {
        let g = graph();
        let index = GraphIndex::new(&g);
        assert_eq!(
            index.producer_node("d").map(|n| n.name.as_str()),
            Some("gather")
        );
        assert_eq!(index.producer("x"), None);
        // `add` reads `d` twice and is listed once
        assert_eq!(index.consumers("d"), &[4]);
        assert_eq!(index.consumers("x"), &[2]);
        assert!(index.is_graph_output("y") && !index.is_graph_output("d"));
        assert!(index.is_graph_input("x") && !index.is_graph_input("w"));
    }

    #[test]
    fn subgraph_nodes_read_the_graph_by_name() {
        let g = graph();
        let index = GraphIndex::with_subgraphs(&g);
        let readers: Vec<&str> = index
            .consumers("x")
            .iter()
            .map(|&r| index.node(r).name.as_str())
            .collect();
        assert_eq!(readers, ["shape", "inner"]);
        // the graph's own nodes keep their positions; a subgraph's outputs have no producer
        assert_eq!(index.node(5).name, "if");
        assert_eq!(index.producer("z"), None);
        // at any depth, a subgraph's node is told by the graph's node holding it
        let deep = *index.consumers("d").last().unwrap();
        assert_eq!(index.consumers("d").len(), 2);
        assert_eq!(index.holder(deep), Some((5, "then_branch")));
        assert_eq!(index.label(deep), "deep (in then_branch of if)");
        assert_eq!(index.holder(4), None);
        assert_eq!(index.label(4), "add");
        // an index without subgraphs has none of them
        assert_eq!(GraphIndex::new(&g).consumers("d"), &[4]);
    }

    #[test]
    fn constants_are_initializers_and_constant_nodes() {
        let g = graph();
        let index = GraphIndex::new(&g);
        assert_eq!(index.small_ints("axes"), Some((&[1][..], vec![0])));
        assert_eq!(index.small_ints("w"), Some((&[1][..], vec![1])));
        // nine values are not small; floats are not ints; a list attribute has no tensor
        assert_eq!(index.small_ints("big"), None);
        assert_eq!(index.small_ints("f"), None);
        assert!(index.constant("list").is_none() && index.constant_node("list").is_some());
        assert_eq!(index.small_ints("d"), None);
        // an initializer the caller may feed is written in the file but not constant
        assert!(index.constant("w").is_some() && !index.is_constant("w"));
        assert!(index.is_constant("big") && index.is_constant("list"));
    }
}
