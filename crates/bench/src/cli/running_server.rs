//! Whether an OpenAI-compatible server already answers at an address, and which models it
//! serves: how `spindle launch` decides between the user's server and one it starts.

use std::time::Duration;

use anyhow::bail;

/// How long the question may take; a server that answers at all answers at once.
const ASK_TIMEOUT: Duration = Duration::from_secs(30);

/// What answers at an address.
#[derive(Debug, PartialEq)]
pub enum AtAddress {
    /// Nothing listens there.
    Nothing,
    /// A server with these models.
    Serving(Vec<String>),
}

/// Asks `GET /v1/models` at `base_url`. Anything but a refused connection that is not a model
/// list (another program on the port, a key that does not open it) is an error saying so.
pub async fn models_at(base_url: &str, api_key: Option<&str>) -> anyhow::Result<AtAddress> {
    let http = reqwest::Client::builder().timeout(ASK_TIMEOUT).build()?;
    let mut request = http.get(format!("{base_url}/v1/models"));
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    let response = match request.send().await {
        Ok(response) => response,
        Err(e) if e.is_connect() => return Ok(AtAddress::Nothing),
        Err(e) => bail!("cannot ask {base_url} for its models: {e}"),
    };
    let status = response.status().as_u16();
    if status == 401 {
        let hint = if api_key.is_some() {
            "the key given is not its key"
        } else {
            "pass --api-key (or set SPINDLE_API_KEY)"
        };
        bail!("the server at {base_url} needs an API key: {hint}");
    }
    let body = response.text().await.unwrap_or_default();
    match model_ids(&body) {
        Some(models) if status == 200 => Ok(AtAddress::Serving(models)),
        _ => bail!(
            "{base_url} answers, but not as an OpenAI-compatible server (HTTP {status} to \
             /v1/models)"
        ),
    }
}

/// The `id`s of a `/v1/models` list; None when the body is not one.
fn model_ids(body: &str) -> Option<Vec<String>> {
    let list: serde_json::Value = serde_json::from_str(body).ok()?;
    let data = list.get("data")?.as_array()?;
    data.iter().map(|card| Some(card.get("id")?.as_str()?.to_string())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_list_gives_its_ids_and_anything_else_none() {
        let list = r#"{"object":"list","data":[{"id":"a"},{"id":"b"}]}"#;
        assert_eq!(model_ids(list), Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(model_ids(r#"{"data":[{"name":"a"}]}"#), None);
        assert_eq!(model_ids("<html>"), None);
    }
}
