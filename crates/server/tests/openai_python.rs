//! The official `openai` Python client against the real server: a streamed chat with logprobs
//! and usage, the same chat unstreamed, a legacy completion, and two errors mapped to the
//! client's exception types. The client is installed from PyPI into a virtual environment
//! under `$SPINDLE_HOME/venv-openai` on first use.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{server, Setup};

fn run(cmd: &mut Command) {
    let output = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        output.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A Python interpreter that can import `openai`.
fn python_with_openai() -> PathBuf {
    let venv = spindle_hub::spindle_home().join("venv-openai");
    let python = venv.join("bin/python");
    let ready = |p: &Path| {
        Command::new(p).args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success())
    };
    if !ready(&python) {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
        run(Command::new(&python).args(["-m", "pip", "install", "--quiet", "openai>=1.40"]));
    }
    python
}

#[test]
fn the_official_openai_python_client_works_unchanged() {
    let python = python_with_openai();
    let base = server(Setup::Default);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/openai_client.py");
    run(Command::new(python).arg(script).arg(base));
}
