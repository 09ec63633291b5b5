//! Resumable HTTP downloads streamed to disk.
//!
//! One agent is used per pull: connecting (and name resolution) gives up after 5 s so an
//! unreachable host fails fast, HTTP statuses are handled here rather than turned into errors, and
//! TLS trusts the system CA bundle when one is found (corporate and sandbox proxies re-sign TLS
//! with their own CA) before falling back to the bundled Mozilla roots.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::Path;
use std::time::Duration;

use tracing::info;
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};

use crate::digest::HashingWriter;
use crate::error::HubError;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

/// CA bundles of common systems, tried after `$SSL_CERT_FILE`.
const CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Builds the HTTP agent used for index queries and downloads.
pub(crate) fn agent() -> ureq::Agent {
    let tls = TlsConfig::builder().root_certs(root_certs()).build();
    ureq::Agent::config_builder()
        .timeout_resolve(Some(CONNECT_TIMEOUT))
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_recv_response(Some(RESPONSE_TIMEOUT))
        .http_status_as_error(false)
        .user_agent(concat!("spindle-hub/", env!("CARGO_PKG_VERSION")))
        .tls_config(tls)
        .build()
        .into()
}

fn root_certs() -> RootCerts {
    let env = std::env::var_os("SSL_CERT_FILE").map(std::path::PathBuf::from);
    let candidates = env.into_iter().chain(CA_BUNDLES.iter().map(Into::into));
    for path in candidates {
        let Ok(pem) = fs::read(&path) else { continue };
        let certs: Vec<Certificate<'static>> = ureq::tls::parse_pem(&pem)
            .filter_map(|item| match item {
                Ok(PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        if !certs.is_empty() {
            return certs.into();
        }
    }
    RootCerts::WebPki
}

/// GETs a small text document (a package index page) with the given `Accept` header.
pub(crate) fn get_text(agent: &ureq::Agent, url: &str, accept: &str) -> Result<String, HubError> {
    let fail = |reason: String| HubError::Download { url: url.to_string(), reason };
    let resp = agent.get(url).header("Accept", accept).call().map_err(|e| fail(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(fail(format!("HTTP {}", resp.status())));
    }
    resp.into_body().read_to_string().map_err(|e| fail(e.to_string()))
}

/// Downloads `url` into `partial` and returns the sha256 of the whole file.
///
/// If `partial` already holds bytes from an interrupted download, only the rest is requested
/// (`Range: bytes=N-`); a server that answers 200 instead of 206 makes us start over, and 416
/// means the partial file is already complete. On a transfer error the partial file is kept so
/// the next attempt resumes; checking the digest and renaming are up to the caller.
pub(crate) fn to_file(
    agent: &ureq::Agent,
    url: &str,
    partial: &Path,
    bearer: Option<&str>,
) -> Result<String, HubError> {
    let fail = |reason: String| HubError::Download { url: url.to_string(), reason };
    let have = fs::metadata(partial).map(|m| m.len()).unwrap_or(0);

    // Compressed transfer encodings would make byte ranges refer to the wrong bytes.
    let mut req = agent.get(url).header("Accept-Encoding", "identity");
    if have > 0 {
        req = req.header("Range", format!("bytes={have}-"));
    }
    if let Some(token) = bearer {
        req = req.header("Authorization", format!("Bearer {token}"));
    }
    let resp = req.call().map_err(|e| fail(e.to_string()))?;
    let status = resp.status().as_u16();
    let content_range = resp.headers().get("content-range").and_then(|v| v.to_str().ok());

    let (file, start) = match status {
        206 if have > 0 => {
            let expected = format!("bytes {have}-");
            if !content_range.is_some_and(|r| r.starts_with(&expected)) {
                return Err(fail(format!("asked for {expected}, got range {content_range:?}")));
            }
            let file =
                OpenOptions::new().append(true).open(partial).map_err(HubError::io(partial))?;
            (file, have)
        }
        200 => (File::create(partial).map_err(HubError::io(partial))?, 0),
        416 if have > 0 => return crate::digest::sha256_file(partial),
        _ => return Err(fail(format!("HTTP {}", resp.status()))),
    };

    let remaining =
        resp.headers().get("content-length").and_then(|v| v.to_str().ok()?.parse().ok());
    match remaining {
        Some(n) if start > 0 => {
            info!("downloading {url}: resuming at {} of {} MB", mb(start), mb(start + n))
        }
        Some(n) => info!("downloading {url} ({} MB)", mb(n)),
        None => info!("downloading {url}"),
    }

    let mut out = HashingWriter::new(file);
    if start > 0 {
        seed_from_file(&mut out, partial)?;
    }
    let mut body = resp.into_body().into_reader();
    copy(&mut body, &mut out).map_err(|e| fail(e.to_string()))?;
    let (mut file, digest) = out.finish();
    file.flush().map_err(HubError::io(partial))?;
    Ok(digest)
}

/// Hashes the bytes already in `path` into `out` without writing them again.
fn seed_from_file(out: &mut HashingWriter<File>, path: &Path) -> Result<(), HubError> {
    let mut file = File::open(path).map_err(HubError::io(path))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(HubError::io(path))?;
        if n == 0 {
            return Ok(());
        }
        out.seed(&buf[..n]);
    }
}

/// `io::copy` with a 1 MiB buffer (the default 8 KiB costs many syscalls on GB-sized files).
fn copy(reader: &mut impl Read, writer: &mut impl Write) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        writer.write_all(&buf[..n])?;
        total += n as u64;
    }
}

fn mb(bytes: u64) -> u64 {
    bytes.div_ceil(1_000_000)
}
