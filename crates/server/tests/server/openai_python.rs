//! The official `openai` Python client against the real server: a streamed chat with logprobs
//! and usage, the same chat unstreamed, a legacy completion, and two errors mapped to the
//! client's exception types; and its Responses API client, stream and whole. The client is installed from PyPI into a virtual environment
//! under `$SPINDLE_HOME/venv-openai` on first use.

use crate::common;

use common::{python_with, run_python_script, server, Setup};

#[test]
fn the_official_openai_python_client_works_unchanged() {
    let python = python_with("import openai", "openai>=1.66");
    let base = server(Setup::Smol);
    run_python_script(&python, "openai_client.py", &[base]);
}

#[test]
fn the_official_openai_python_client_reads_responses_unchanged() {
    let python = python_with("from openai.resources import responses", "openai>=1.66");
    let base = server(Setup::Smol);
    run_python_script(&python, "openai_responses.py", &[base]);
}
