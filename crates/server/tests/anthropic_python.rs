//! The official `anthropic` Python client against the real servers: a text answer whole and
//! streamed, count_tokens, raw events, errors as the SDK's exceptions, a thinking block, and a
//! tool round trip on Qwen2.5. The client comes from PyPI into `$SPINDLE_HOME/venv-openai`
//! (where `.ci/run` installs it) on first use.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{server, Setup};

/// A Python interpreter that can import `anthropic`.
fn python_with_anthropic() -> PathBuf {
    let venv = spindle_hub::spindle_home().join("venv-openai");
    let python = venv.join("bin/python");
    let ready = |p: &Path| {
        Command::new(p).args(["-c", "import anthropic"]).output().is_ok_and(|o| o.status.success())
    };
    if !ready(&python) {
        if !python.exists() {
            assert!(Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv)
                .status()
                .unwrap()
                .success());
        }
        let install = Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "anthropic>=0.40"])
            .status();
        assert!(install.unwrap().success(), "installing anthropic failed");
    }
    python
}

#[test]
fn the_official_anthropic_python_client_works_unchanged() {
    let python = python_with_anthropic();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/anthropic_client.py");
    let bases = [server(Setup::Default), server(Setup::Thinking), server(Setup::Qwen)];
    let output = Command::new(python).arg(script).args(&bases).output().unwrap();
    assert!(
        output.status.success(),
        "the anthropic client failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
