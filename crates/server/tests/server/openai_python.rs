//! The official `openai` Python client against the real server: a streamed chat with logprobs
//! and usage, the same chat unstreamed, a legacy completion, and two errors mapped to the
//! client's exception types. The client is installed from PyPI into a virtual environment
//! under `$SPINDLE_HOME/venv-openai` on first use.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use common::{python_with, server, Setup};

fn run(cmd: &mut Command) {
    let output = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        output.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_official_openai_python_client_works_unchanged() {
    let python = python_with("import openai", "openai>=1.66");
    let base = server(Setup::Default);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/openai_client.py");
    run(Command::new(python).arg(script).arg(base));
}
