//! `--profile`: where each path's time goes, per op kind and for the slowest nodes.

use attnrt::{Profile, ProfileReport};
use clap::Args;

/// Flags of `run` and `bench` that ask for a profile.
#[derive(Args, Debug, Clone, Copy)]
pub struct ProfileArgs {
    /// Time every node of the run(s): time per op kind (the ONNX op type a node came from)
    /// and the slowest nodes, per path ("profile" in --json).
    #[arg(long)]
    pub profile: bool,
    /// How many of the slowest nodes --profile lists.
    #[arg(long, value_name = "N", default_value_t = 10, requires = "profile")]
    pub profile_top: usize,
}

impl ProfileArgs {
    /// The report of `p` with as many nodes as asked for, for `--json`.
    pub fn json(&self, p: Option<&Profile>) -> serde_json::Value {
        p.map(|p| serde_json::to_value(p.report(self.profile_top)))
            .transpose()
            .ok()
            .flatten()
            .unwrap_or(serde_json::Value::Null)
    }

    /// Prints the profile of the path `label` as text.
    pub fn print(&self, label: &str, p: &Profile) {
        for line in text(label, &p.report(self.profile_top)) {
            println!("{line}");
        }
    }
}

fn pct(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// The lines of a profile report: a headline, a table per op kind, the slowest nodes.
fn text(label: &str, r: &ProfileReport) -> Vec<String> {
    let runs = if r.runs == 1 {
        "1 run".to_string()
    } else {
        format!("mean of {} runs", r.runs)
    };
    let mut lines = vec![format!(
        "profile ({label}, {runs}): {:.3} ms; in nodes {:.3} ms, outside nodes {:.3} ms",
        r.run_ms, r.ops_ms, r.other_ms
    )];
    let width = r
        .by_op
        .iter()
        .map(|k| k.op.len())
        .chain(r.top_nodes.iter().map(|n| n.op.len()))
        .chain([7])
        .max()
        .unwrap_or(7);
    lines.push(format!(
        "  {:<width$} {:>10} {:>7} {:>6}",
        "op kind", "ms", "share", "nodes"
    ));
    for k in &r.by_op {
        lines.push(format!(
            "  {:<width$} {:>10.3} {:>7} {:>6}",
            k.op,
            k.ms,
            pct(k.share),
            k.nodes
        ));
    }
    if !r.top_nodes.is_empty() {
        lines.push(format!("  slowest {} node(s):", r.top_nodes.len()));
    }
    for n in &r.top_nodes {
        lines.push(format!(
            "  {:<width$} {:>10.3} {:>7}  {} [{}]",
            n.op,
            n.ms,
            pct(n.share),
            n.node,
            n.tract_op
        ));
    }
    lines
}
