//! The chat page at `/`: browsers get the page and its files without a key, every other client
//! the health JSON it always had, and `/v1/models` tells the page the context it fills.

use axum::body::Body;
use axum::http::{header, Request};

use crate::common::{body_text, replying, server_with, MODEL};

fn get_accepting(path: &str, accept: &str) -> Request<Body> {
    Request::get(path).header(header::ACCEPT, accept).body(Body::empty()).unwrap()
}

/// What Chromium sends for a page it navigates to.
const BROWSER_ACCEPT: &str =
    "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8";

#[tokio::test]
async fn a_browser_gets_the_page_and_every_file_it_names() {
    let server = replying("Hello.");
    let response = server.send(get_accepting("/", BROWSER_ACCEPT)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "text/html; charset=utf-8");
    let page = body_text(response).await;
    let files: Vec<&str> =
        page.split("\"/ui/").skip(1).map(|rest| &rest[..rest.find('"').unwrap()]).collect();
    for name in
        ["app.js", "store.js", "stream.js", "markdown.js", "style.css", "manifest.json", "icon.svg"]
    {
        assert!(files.contains(&name), "{name} not named by the page: {files:?}");
    }
    for name in files {
        let response = server.send(get_accepting(&format!("/ui/{name}"), "*/*")).await;
        assert_eq!(response.status(), 200, "{name}");
        let content_type = response.headers()[header::CONTENT_TYPE].to_str().unwrap().to_owned();
        let body = body_text(response).await;
        assert!(!body.is_empty(), "{name} is empty");
        let expected = match name.rsplit('.').next().unwrap() {
            "js" => "text/javascript",
            "css" => "text/css",
            "json" => "application/manifest+json",
            _ => "image/svg+xml",
        };
        assert!(content_type.starts_with(expected), "{name}: {content_type}");
    }
}

#[tokio::test]
async fn api_clients_keep_the_health_json_at_the_root() {
    let server = replying("Hello.");
    let (status, body) = server.get("/").await;
    assert_eq!(
        (status, body["status"].as_str(), body["model"].as_str()),
        (200, Some("ok"), Some(MODEL))
    );
    let (status, body) = server.send_json(get_accepting("/", "application/json")).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("ok")));
    // Claude Code's probe.
    let response = server.send(Request::head("/").body(Body::empty()).unwrap()).await;
    assert_eq!(response.status(), 200);
    let (status, body) = server.get("/health").await;
    assert_eq!((status, body["status"].as_str()), (200, Some("ok")));
}

#[tokio::test]
async fn an_unknown_page_file_is_a_404_naming_it() {
    let server = replying("Hello.");
    let (status, body) = server.send_json(get_accepting("/ui/nope.js", "*/*")).await;
    assert_eq!(status, 404);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("nope.js"), "{message}");
}

#[tokio::test]
async fn with_an_api_key_the_page_loads_but_the_api_asks_for_the_key() {
    let server = server_with(
        |_| crate::common::Reply::text("Hello."),
        |config, _| {
            config.api_key = Some("sesame".into());
        },
    );
    let response = server.send(get_accepting("/", BROWSER_ACCEPT)).await;
    assert_eq!(response.status(), 200);
    let response = server.send(get_accepting("/ui/app.js", "*/*")).await;
    assert_eq!(response.status(), 200);
    let (status, _) = server.get("/v1/models").await;
    assert_eq!(status, 401);
    let authorized = Request::get("/v1/models")
        .header(header::AUTHORIZATION, "Bearer sesame")
        .body(Body::empty())
        .unwrap();
    let (status, models) = server.send_json(authorized).await;
    assert_eq!(status, 200, "{models}");
}

#[tokio::test]
async fn the_model_list_gives_the_context_the_page_gauges() {
    let server = replying("Hello.");
    let (status, models) = server.get("/v1/models").await;
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["max_model_len"], crate::common::config().ctx_size);
}
