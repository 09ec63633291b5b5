//! The official `anthropic` Python client against the real servers: a text answer whole and
//! streamed, count_tokens, raw events, errors as the SDK's exceptions, a thinking block, and a
//! tool round trip on Qwen2.5. The client comes from PyPI into `$SPINDLE_HOME/venv-openai`
//! (where `.ci/run` installs it) on first use.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use common::{python_with, server, Setup};

#[test]
fn the_official_anthropic_python_client_works_unchanged() {
    let python = python_with("import anthropic", "anthropic>=0.40");
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
