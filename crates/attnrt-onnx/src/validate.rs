//! Structural validation: the checks every model attnrt reads or writes must pass.
//!
//! - every non-empty node input is produced exactly once in scope (a graph input, an
//!   initializer, a node output, or a name of an enclosing graph for subgraphs);
//! - no name is produced twice; every graph output is produced;
//! - the nodes form an acyclic graph (they need not be stored in topological order);
//! - every node's domain is imported (or is a model-local function's domain), and the
//!   default-domain opset is one attnrt knows;
//! - every default-domain node names an ONNX operator that exists at the model's opset
//!   (or calls a model-local function);
//! - model-local functions do not call each other recursively and do not expand beyond the
//!   node limit;
//! - then, on a structurally sound model, every operator's own rules ([`crate::op_check`]:
//!   arity, axes, perms, reshape targets, split sizes, constant indices, ...).

use std::collections::{HashMap, HashSet};

use crate::opset::{is_default_domain, MAX_KNOWN_OPSET};
use crate::proto::{GraphProto, ModelProto, NodeProto};
use crate::{node_label, Limits};

/// Why a model is structurally invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// The model has no graph.
    #[error("the model has no graph")]
    NoGraph,
    /// A node reads a tensor that nothing produces.
    #[error("node {node} reads tensor '{tensor}', which no node, input or initializer produces")]
    MissingInput {
        /// The reading node.
        node: String,
        /// The missing tensor.
        tensor: String,
    },
    /// A tensor name is produced twice.
    #[error("tensor '{tensor}' is produced twice (by {first} and by {second})")]
    DuplicateProducer {
        /// The tensor.
        tensor: String,
        /// The first producer.
        first: String,
        /// The second producer.
        second: String,
    },
    /// The graph has a cycle.
    #[error("the graph has a cycle through node(s) {}", nodes.join(", "))]
    Cycle {
        /// Some nodes on (or behind) the cycle.
        nodes: Vec<String>,
    },
    /// A graph output is produced by nothing.
    #[error("graph output '{tensor}' is produced by no node, input or initializer")]
    MissingOutput {
        /// The output.
        tensor: String,
    },
    /// A node has no op_type.
    #[error("node {node} has no op_type")]
    EmptyOpType {
        /// The node.
        node: String,
    },
    /// A node's domain is not imported.
    #[error("node {node} uses domain '{domain}', which the model does not import")]
    MissingOpset {
        /// The node.
        node: String,
        /// Its domain.
        domain: String,
    },
    /// The default-domain opset is outside what attnrt knows.
    #[error("default-domain opset {version} is not one attnrt knows (1 to {MAX_KNOWN_OPSET})")]
    UnknownOpset {
        /// The imported version.
        version: i64,
    },
    /// A default-domain node names an op ONNX does not have.
    #[error("node {node} uses op '{op_type}', which is not an ONNX operator (default domain, opset {opset})")]
    UnknownOp {
        /// The node.
        node: String,
        /// Its op_type.
        op_type: String,
        /// The model's default-domain opset.
        opset: i64,
    },
    /// A default-domain node uses an op newer than the model's opset.
    #[error("node {node} uses op '{op_type}', which exists from opset {since} on, but the model imports opset {opset}")]
    OpTooNew {
        /// The node.
        node: String,
        /// Its op_type.
        op_type: String,
        /// The opset that introduced the op.
        since: i64,
        /// The model's default-domain opset.
        opset: i64,
    },
    /// Model-local functions call each other in a cycle.
    #[error("model-local function '{function}' calls itself (directly or through others)")]
    RecursiveFunction {
        /// A function on the cycle.
        function: String,
    },
    /// Inlining functions would make too many nodes.
    #[error("model-local function '{function}' expands to more than the limit of {limit} nodes")]
    FunctionExpansion {
        /// The function.
        function: String,
        /// The node limit.
        limit: usize,
    },
    /// A node's attributes or inputs break its operator's rules.
    #[error(transparent)]
    Op(#[from] crate::op_check::OpError),
}

/// Validates `model` with the default [`Limits`].
pub fn validate_model(model: &ModelProto) -> Result<(), ValidationError> {
    validate_model_with(model, &Limits::default())
}

/// Validates `model` (see the module documentation for what is checked).
pub fn validate_model_with(model: &ModelProto, limits: &Limits) -> Result<(), ValidationError> {
    let graph = model.graph.as_ref().ok_or(ValidationError::NoGraph)?;
    let imported: HashSet<&str> = model
        .opset_import
        .iter()
        .map(|o| {
            if is_default_domain(&o.domain) {
                ""
            } else {
                o.domain.as_str()
            }
        })
        .collect();
    if let Some(v) = crate::opset::default_version(model) {
        if !(1..=MAX_KNOWN_OPSET).contains(&v) {
            return Err(ValidationError::UnknownOpset { version: v });
        }
    }
    let functions: HashMap<(&str, &str), &crate::proto::FunctionProto> = model
        .functions
        .iter()
        .map(|f| ((f.domain.as_str(), f.name.as_str()), f))
        .collect();
    let domains = Domains {
        imported: &imported,
        function_domains: model.functions.iter().map(|f| f.domain.as_str()).collect(),
        functions: model
            .functions
            .iter()
            .map(|f| (f.domain.as_str(), f.name.as_str()))
            .collect(),
        default_opset: crate::opset::default_version(model),
    };
    check_functions(model, &functions, limits)?;
    check_graph(graph, &HashSet::new(), &domains)?;
    // The operator rules assume the structure holds (every input produced, ops known).
    crate::op_check::check_model(model)?;
    Ok(())
}

struct Domains<'a> {
    imported: &'a HashSet<&'a str>,
    function_domains: HashSet<&'a str>,
    /// (domain, name) of every model-local function: such a node is a call, not an ONNX op.
    functions: HashSet<(&'a str, &'a str)>,
    default_opset: Option<i64>,
}

fn check_node_domain(n: &NodeProto, domains: &Domains) -> Result<(), ValidationError> {
    if n.op_type.is_empty() {
        return Err(ValidationError::EmptyOpType {
            node: node_label(n),
        });
    }
    let d = if is_default_domain(&n.domain) {
        ""
    } else {
        n.domain.as_str()
    };
    if !domains.imported.contains(d) && !domains.function_domains.contains(d) {
        return Err(ValidationError::MissingOpset {
            node: node_label(n),
            domain: n.domain.clone(),
        });
    }
    // An unknown default-domain op would only fail later, in tract, with a message that does
    // not name the node; refuse it here. Model-local functions may live in the default domain.
    if d.is_empty()
        && !domains
            .functions
            .contains(&(n.domain.as_str(), n.op_type.as_str()))
    {
        if let Some(opset) = domains.default_opset {
            match crate::opset::op_since(&n.op_type) {
                None => {
                    return Err(ValidationError::UnknownOp {
                        node: node_label(n),
                        op_type: n.op_type.clone(),
                        opset,
                    })
                }
                Some(since) if since > opset => {
                    return Err(ValidationError::OpTooNew {
                        node: node_label(n),
                        op_type: n.op_type.clone(),
                        since,
                        opset,
                    })
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

fn check_graph(
    g: &GraphProto,
    outer: &HashSet<String>,
    domains: &Domains,
) -> Result<(), ValidationError> {
    // Who produces each name in this graph (described only when an error needs it: building
    // a description per tensor made validation of 300k-node graphs several times slower).
    #[derive(Clone, Copy)]
    enum Producer<'a> {
        Input(&'a str),
        Initializer(&'a str),
        SparseInitializer(&'a str),
        Node(&'a NodeProto),
    }
    let describe = |p: Producer| match p {
        Producer::Input(n) => format!("graph input '{n}'"),
        Producer::Initializer(n) => format!("initializer '{n}'"),
        Producer::SparseInitializer(n) => format!("sparse initializer '{n}'"),
        Producer::Node(n) => format!("node {}", node_label(n)),
    };
    let mut producer: HashMap<&str, Producer> =
        HashMap::with_capacity(g.node.len() + g.input.len());
    for i in &g.input {
        producer.insert(i.name.as_str(), Producer::Input(&i.name));
    }
    for t in &g.initializer {
        // Older IRs list initializers among the inputs too; that is one name, not two producers.
        producer
            .entry(t.name.as_str())
            .or_insert(Producer::Initializer(&t.name));
    }
    for s in &g.sparse_initializer {
        if let Some(v) = &s.values {
            producer
                .entry(v.name.as_str())
                .or_insert(Producer::SparseInitializer(&v.name));
        }
    }
    let mut node_of_output: HashMap<&str, usize> = HashMap::with_capacity(g.node.len());
    for (idx, n) in g.node.iter().enumerate() {
        check_node_domain(n, domains)?;
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            if let Some(first) = producer.get(o.as_str()) {
                return Err(ValidationError::DuplicateProducer {
                    tensor: o.clone(),
                    first: describe(*first),
                    second: format!("node {}", node_label(n)),
                });
            }
            producer.insert(o.as_str(), Producer::Node(n));
            node_of_output.insert(o.as_str(), idx);
        }
    }
    // Every input is produced here or in an enclosing graph.
    for n in &g.node {
        for i in n.input.iter().filter(|i| !i.is_empty()) {
            if !producer.contains_key(i.as_str()) && !outer.contains(i) {
                return Err(ValidationError::MissingInput {
                    node: node_label(n),
                    tensor: i.clone(),
                });
            }
        }
    }
    for o in &g.output {
        if !producer.contains_key(o.name.as_str()) && !outer.contains(&o.name) {
            return Err(ValidationError::MissingOutput {
                tensor: o.name.clone(),
            });
        }
    }
    topo_order_with(g, &node_of_output)?;
    // Subgraphs see every name of this scope.
    let has_subgraphs = g.node.iter().any(|n| {
        n.attribute
            .iter()
            .any(|a| a.g.is_some() || !a.graphs.is_empty())
    });
    if has_subgraphs {
        let mut scope = outer.clone();
        scope.extend(producer.keys().map(|k| k.to_string()));
        for n in &g.node {
            for a in &n.attribute {
                for sub in a.g.iter().chain(a.graphs.iter()) {
                    check_graph(sub, &scope, domains)?;
                }
            }
        }
    }
    Ok(())
}

/// A topological order of `g`'s nodes (indices into `g.node`), stable: among ready nodes the
/// one stored first comes first, so an already-sorted graph keeps its order.
pub fn topo_order(g: &GraphProto) -> Result<Vec<usize>, ValidationError> {
    let mut node_of_output = HashMap::new();
    for (idx, n) in g.node.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            node_of_output.insert(o.as_str(), idx);
        }
    }
    topo_order_with(g, &node_of_output)
}

fn topo_order_with(
    g: &GraphProto,
    node_of_output: &HashMap<&str, usize>,
) -> Result<Vec<usize>, ValidationError> {
    let n = g.node.len();
    let mut indegree = vec![0usize; n];
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (idx, node) in g.node.iter().enumerate() {
        // Inputs read by subgraphs count too: the node must come after their producers.
        let mut deps: Vec<usize> = node
            .input
            .iter()
            .chain(subgraph_outer_reads(node).iter())
            .filter_map(|i| node_of_output.get(i.as_str()).copied())
            .collect();
        deps.sort_unstable();
        deps.dedup();
        for d in deps {
            indegree[idx] += 1;
            users[d].push(idx);
        }
    }
    // Min-heap on index keeps the order stable.
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = (0..n)
        .filter(|&i| indegree[i] == 0)
        .map(std::cmp::Reverse)
        .collect();
    let mut order = Vec::with_capacity(n);
    while let Some(std::cmp::Reverse(i)) = ready.pop() {
        order.push(i);
        for &u in &users[i] {
            indegree[u] -= 1;
            if indegree[u] == 0 {
                ready.push(std::cmp::Reverse(u));
            }
        }
    }
    if order.len() != n {
        let nodes = (0..n)
            .filter(|&i| indegree[i] > 0)
            .take(5)
            .map(|i| node_label(&g.node[i]))
            .collect();
        return Err(ValidationError::Cycle { nodes });
    }
    Ok(order)
}

/// Names a node's subgraphs read from enclosing scopes (inputs of subgraph nodes that the
/// subgraph itself does not produce).
fn subgraph_outer_reads(node: &NodeProto) -> Vec<String> {
    fn collect(g: &GraphProto, out: &mut Vec<String>) {
        let mut local: HashSet<&str> = g.input.iter().map(|i| i.name.as_str()).collect();
        local.extend(g.initializer.iter().map(|t| t.name.as_str()));
        local.extend(
            g.node
                .iter()
                .flat_map(|n| n.output.iter().map(String::as_str)),
        );
        for n in &g.node {
            for i in n.input.iter().filter(|i| !i.is_empty()) {
                if !local.contains(i.as_str()) {
                    out.push(i.clone());
                }
            }
            for a in &n.attribute {
                for sub in a.g.iter().chain(a.graphs.iter()) {
                    let mut inner = Vec::new();
                    collect(sub, &mut inner);
                    out.extend(inner.into_iter().filter(|i| !local.contains(i.as_str())));
                }
            }
        }
        for o in &g.output {
            if !local.contains(o.name.as_str()) {
                out.push(o.name.clone());
            }
        }
    }
    let mut out = Vec::new();
    for a in &node.attribute {
        for sub in a.g.iter().chain(a.graphs.iter()) {
            collect(sub, &mut out);
        }
    }
    out
}

/// Refuses recursive model-local functions and functions whose full inlining exceeds the
/// node limit (a chain of functions each calling the next twice grows exponentially).
fn check_functions(
    model: &ModelProto,
    functions: &HashMap<(&str, &str), &crate::proto::FunctionProto>,
    limits: &Limits,
) -> Result<(), ValidationError> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        Visiting,
        Done(usize),
    }
    fn expand<'a>(
        key: (&'a str, &'a str),
        functions: &HashMap<(&'a str, &'a str), &'a crate::proto::FunctionProto>,
        state: &mut HashMap<(&'a str, &'a str), State>,
        limit: usize,
        depth: usize,
    ) -> Result<usize, ValidationError> {
        match state.get(&key) {
            Some(State::Done(n)) => return Ok(*n),
            Some(State::Visiting) => {
                return Err(ValidationError::RecursiveFunction {
                    function: key.1.to_string(),
                })
            }
            None => {}
        }
        if depth > functions.len() {
            return Err(ValidationError::RecursiveFunction {
                function: key.1.to_string(),
            });
        }
        state.insert(key, State::Visiting);
        let f = functions[&key];
        let mut total: usize = 0;
        for n in &f.node {
            let callee = (n.domain.as_str(), n.op_type.as_str());
            let size = if functions.contains_key(&callee) {
                expand(callee, functions, state, limit, depth + 1)?
            } else {
                1
            };
            total = total.saturating_add(size);
            if total > limit {
                return Err(ValidationError::FunctionExpansion {
                    function: key.1.to_string(),
                    limit,
                });
            }
        }
        state.insert(key, State::Done(total));
        Ok(total)
    }
    let mut state = HashMap::new();
    for f in &model.functions {
        expand(
            (f.domain.as_str(), f.name.as_str()),
            functions,
            &mut state,
            limits.max_nodes,
            0,
        )?;
    }
    Ok(())
}
