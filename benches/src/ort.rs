//! ONNX Runtime in the same benchmark run: runs `benches/python/ort_bench.py` (which builds the
//! same MHA layer with the onnx helper) and reads its JSON.
//!
//! The Python interpreter is `$ATTNRT_PYTHON`, else `python3`. ORT is optional: without onnxruntime the script exits with status 3 and the
//! benches print that ORT was skipped.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// The script's path in this checkout.
pub fn script_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("python")
        .join("ort_bench.py")
}

/// The Python interpreter to use.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("ATTNRT_PYTHON") {
        return PathBuf::from(p);
    }
    PathBuf::from("python3")
}

/// One timed case of the script.
#[derive(Clone, Debug, PartialEq)]
pub struct OrtResult {
    /// `attention_op` (ONNX `Attention`, opset 23) or `decomposed` (MatMul/Softmax chain).
    pub form: String,
    /// Sequence length.
    pub len: usize,
    /// Intra-op threads.
    pub threads: usize,
    /// Median of the timed runs, ms.
    pub median_ms: f64,
    /// Peak resident set of the child process that ran the case, MB.
    pub peak_rss_mb: f64,
    /// onnxruntime's version.
    pub version: String,
}

/// Runs the script for `lens` with `threads` intra-op threads and `reps` timed runs each.
/// `Ok(None)` when the interpreter or onnxruntime is missing (a reason is printed on stderr).
pub fn run(lens: &[usize], threads: usize, reps: usize) -> Result<Option<Vec<OrtResult>>> {
    let lens_arg = lens
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let py = python();
    let script = script_path();
    let out = match Command::new(&py)
        .arg(&script)
        .args([
            "--json",
            "--lens",
            &lens_arg,
            "--threads",
            &threads.to_string(),
            "--reps",
            &reps.to_string(),
        ])
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "ONNX Runtime comparison skipped: cannot start {}: {e}",
                py.display()
            );
            return Ok(None);
        }
    };
    if out.status.code() == Some(3) {
        eprintln!(
            "ONNX Runtime comparison skipped: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return Ok(None);
    }
    if !out.status.success() {
        bail!(
            "{} {} failed ({}):\n{}",
            py.display(),
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .last()
        .context("ort_bench.py printed nothing")?;
    parse(line).map(Some)
}

/// One ONNX Runtime session kept in a Python child (`ort_bench.py --serve`) and timed on demand,
/// so that its runs can alternate with attnrt's and the two be compared at the same moment (this
/// machine's speed changes from minute to minute; a ratio of medians taken minutes apart moves
/// with it).
pub struct OrtServer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// onnxruntime's version.
    pub version: String,
    /// The child's ready line (what it reported about its session).
    pub ready: Value,
}

impl OrtServer {
    /// Starts the child for the layer as `form` at `len` tokens with `threads` intra-op threads
    /// and waits until it has warmed up. `Ok(None)` when the interpreter or onnxruntime is
    /// missing (a reason is printed on stderr).
    pub fn start(form: &str, len: usize, threads: usize) -> Result<Option<Self>> {
        let args: Vec<String> = vec![
            "--serve".into(),
            "--forms".into(),
            form.into(),
            "--lens".into(),
            len.to_string(),
            "--threads".into(),
            threads.to_string(),
        ];
        Self::spawn(&script_path(), &args, &format!("{form} L={len}"))
    }

    /// Starts `script` (one of `benches/python/*.py` with the `--serve` protocol: a ready line,
    /// then `run N` → `{"ms": [...]}`) with `args`, and waits for its ready line. `what` names
    /// the case in errors. `Ok(None)` when the interpreter or onnxruntime is missing.
    pub fn spawn(script: &Path, args: &[String], what: &str) -> Result<Option<Self>> {
        let py = python();
        let name = script.file_name().map_or_else(
            || script.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        let mut child = match Command::new(&py)
            .arg(script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                eprintln!(
                    "ONNX Runtime comparison skipped: cannot start {}: {e}",
                    py.display()
                );
                return Ok(None);
            }
        };
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            bail!("{name} --serve: no pipes to the child");
        };
        let mut server = OrtServer {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            version: String::new(),
            ready: Value::Null,
        };
        let ready = match server.reply() {
            Ok(v) => v,
            Err(e) => {
                // Exit status 3: onnxruntime or onnx cannot be imported (the script said so).
                if let Ok(Some(status)) = server.child.try_wait() {
                    if status.code() == Some(3) {
                        eprintln!("ONNX Runtime comparison skipped (see above)");
                        return Ok(None);
                    }
                }
                return Err(e.context(format!("{name} --serve {what}")));
            }
        };
        if ready["ready"].as_bool() != Some(true) {
            bail!("{name} --serve {what}: unexpected first line {ready}");
        }
        server.version = ready["onnxruntime"].as_str().unwrap_or("?").to_string();
        server.ready = ready;
        Ok(Some(server))
    }

    /// Times `runs` runs; milliseconds per run.
    pub fn time(&mut self, runs: usize) -> Result<Vec<f64>> {
        writeln!(self.stdin, "run {runs}").context("writing to the ORT --serve child")?;
        self.stdin
            .flush()
            .context("writing to the ORT --serve child")?;
        let v = self.reply()?;
        let ms = v["ms"]
            .as_array()
            .with_context(|| format!("the ORT --serve child answered {v}"))?;
        ms.iter()
            .map(|x| {
                x.as_f64()
                    .with_context(|| format!("non-numeric time in {v}"))
            })
            .collect()
    }

    /// The next JSON line from the child.
    fn reply(&mut self) -> Result<Value> {
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .context("reading from the ORT --serve child")?;
        if n == 0 {
            let status = self
                .child
                .wait()
                .context("waiting for the ORT --serve child")?;
            bail!("the ORT --serve child exited ({status}) without answering");
        }
        serde_json::from_str(line.trim())
            .with_context(|| format!("the ORT --serve child printed {line:?}"))
    }
}

impl Drop for OrtServer {
    fn drop(&mut self) {
        // Nothing the child would still print is needed; make sure it is gone.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Parses the script's `--json` output.
pub fn parse(json: &str) -> Result<Vec<OrtResult>> {
    let v: Value = serde_json::from_str(json).context("ort_bench.py output is not JSON")?;
    let results = v["results"]
        .as_array()
        .context("ort_bench.py output has no 'results' array")?;
    results
        .iter()
        .map(|r| {
            let num = |k: &str| {
                r[k].as_f64()
                    .with_context(|| format!("ort_bench.py result without numeric '{k}': {r}"))
            };
            Ok(OrtResult {
                form: r["form"]
                    .as_str()
                    .context("result without 'form'")?
                    .to_string(),
                len: num("len")? as usize,
                threads: num("threads")? as usize,
                median_ms: num("median_ms")?,
                peak_rss_mb: num("peak_rss_mb")?,
                version: r["onnxruntime"].as_str().unwrap_or("?").to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_script_output() {
        let r = parse(r#"{"threads": 2, "results": [{"form": "attention_op", "len": 64, "threads": 2, "median_ms": 45.6, "min_ms": 34.3, "max_ms": 56.9, "reps": 2, "peak_rss_mb": 131.25, "onnxruntime": "1.31.1"}]}"#).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].form, "attention_op");
        assert_eq!(r[0].len, 64);
        assert_eq!(r[0].median_ms, 45.6);
        assert_eq!(r[0].version, "1.31.1");
        assert!(parse(r#"{"results": [{"form": "x"}]}"#).is_err());
        assert!(parse("not json").is_err());
    }

    #[test]
    fn a_served_session_times_runs_on_demand() {
        // `scripts/test.sh` sets ATTNRT_PYTHON to a venv with onnx and onnxruntime; elsewhere
        // the server may be unavailable, which `start` reports as `None`.
        let Some(mut server) = OrtServer::start("attention_op", 16, 1).unwrap() else {
            assert!(
                std::env::var_os("ATTNRT_PYTHON").is_none(),
                "ATTNRT_PYTHON is set, yet ort_bench.py --serve did not start"
            );
            eprintln!("skipped: no Python with onnxruntime");
            return;
        };
        assert!(!server.version.is_empty() && server.version != "?");
        for runs in [3, 1] {
            let ms = server.time(runs).unwrap();
            assert_eq!(ms.len(), runs);
            assert!(ms.iter().all(|&x| x.is_finite() && x > 0.0), "{ms:?}");
        }
        // A child that exits at once (unknown form: argparse's usage error) is an error that
        // names the script, not a hang.
        let err = OrtServer::start("no_such_form", 16, 1)
            .err()
            .expect("an error");
        assert!(
            format!("{err:#}").contains("ort_bench.py --serve"),
            "{err:#}"
        );
    }
}
