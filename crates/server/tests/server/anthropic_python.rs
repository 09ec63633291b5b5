//! The official `anthropic` Python client against the real servers: a text answer whole and
//! streamed, count_tokens, raw events, errors as the SDK's exceptions, a thinking block, and a
//! tool round trip on Qwen2.5. The client comes from PyPI into `$SPINDLE_HOME/venv-openai`
//! (where `.ci/run` installs it) on first use.

use crate::common;

use common::{python_with, run_python_script, server, Setup};

#[test]
fn the_official_anthropic_python_client_works_unchanged() {
    let python = python_with("import anthropic", "anthropic>=0.40");
    let bases = [server(Setup::Smol), server(Setup::Thinking), server(Setup::Qwen)];
    run_python_script(&python, "anthropic_client.py", &bases);
}
