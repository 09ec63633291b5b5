//! Files and batches on disk, under one folder (`--batch-dir`, default `$SPINDLE_HOME/batches`),
//! so a restarted server finds them and resumes unfinished batches. Plain JSON, each record
//! replaced by an atomic rename:
//!
//! ```text
//! files/file-….jsonl        contents          files/file-….json    its file object
//! batches/batch_….json      the batch object
//! batches/batch_….output    results so far    batches/batch_….errors   failures so far
//! ```
//!
//! Results are appended as requests finish; on resume the custom ids found there are not run
//! again (a torn last line is dropped, so that one request runs again). At the end the two
//! logs become the batch's output and error files, under ids derived from the batch id, so a
//! crash while finalizing is finished on resume without losing either.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use spindle_api::{ApiError, Batch, BatchInputLine, BatchOutputLine, FileObject, RequestCounts};
use tokio::sync::Notify;

use crate::clock::unix_now;

/// Where batch files live and how large an input may be.
#[derive(Clone, Debug)]
pub struct BatchConfig {
    pub dir: PathBuf,
    /// Largest uploaded file (413 above).
    pub max_file_bytes: usize,
    /// Most requests in one input file (400 above).
    pub max_requests: usize,
}

impl BatchConfig {
    /// OpenAI's limits: 200 MB and 50,000 requests per file.
    pub fn new(dir: PathBuf) -> Self {
        Self { dir, max_file_bytes: 200_000_000, max_requests: 50_000 }
    }
}

/// Which of a batch's two result logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultLog {
    Output,
    Errors,
}

impl ResultLog {
    fn extension(self) -> &'static str {
        match self {
            Self::Output => "output",
            Self::Errors => "errors",
        }
    }
}

pub struct BatchStore {
    files: PathBuf,
    batches_dir: PathBuf,
    /// Every batch by id; ids sort by creation time.
    batches: Mutex<BTreeMap<String, Batch>>,
    /// Wakes the batch worker: a batch was created or cancelled.
    pub changed: Notify,
}

impl BatchStore {
    /// Opens the store in `dir`, reading the batches a previous server left there.
    pub fn open(dir: &Path) -> Self {
        let (files, batches_dir) = (dir.join("files"), dir.join("batches"));
        let mut batches = BTreeMap::new();
        for path in json_records(&batches_dir) {
            match std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Batch>(&b).map_err(|e| e.to_string()))
            {
                Ok(batch) => {
                    batches.insert(batch.id.clone(), batch);
                }
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "skipping an unreadable batch record")
                }
            }
        }
        Self { files, batches_dir, batches: Mutex::new(batches), changed: Notify::new() }
    }

    /// A file to write an upload into; it disappears unless [`BatchStore::add_file`] keeps it.
    pub fn stage_file(&self) -> std::io::Result<(StagedFile, std::fs::File)> {
        std::fs::create_dir_all(&self.files)?;
        let path = self.files.join(format!(".upload-{:032x}", rand::random::<u128>()));
        let file = std::fs::File::create(&path)?;
        Ok((StagedFile { path }, file))
    }

    /// Keeps a staged upload as a new file.
    pub fn add_file(
        &self,
        staged: StagedFile,
        filename: String,
        purpose: &str,
    ) -> std::io::Result<FileObject> {
        let bytes = std::fs::metadata(&staged.path)?.len();
        let file = FileObject {
            id: new_id("file-"),
            bytes,
            created_at: unix_now(),
            filename,
            purpose: purpose.into(),
            status: "processed".into(),
        };
        std::fs::rename(&staged.path, self.content_path(&file.id))?;
        write_json(&self.files.join(format!("{}.json", file.id)), &file)?;
        Ok(file)
    }

    pub fn file(&self, id: &str) -> Option<FileObject> {
        if !is_safe_id(id) {
            return None;
        }
        std::fs::read(self.files.join(format!("{id}.json")))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
    }

    /// Every file, newest first.
    pub fn files(&self) -> Vec<FileObject> {
        let mut files: Vec<FileObject> = json_records(&self.files)
            .iter()
            .filter_map(|p| serde_json::from_slice(&std::fs::read(p).ok()?).ok())
            .collect();
        files.sort_by(|a: &FileObject, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        files
    }

    /// Where file `id`'s contents are (check that the file exists first).
    pub fn content_path(&self, id: &str) -> PathBuf {
        self.files.join(format!("{id}.jsonl"))
    }

    /// Deletes file `id`; false when there is none.
    pub fn delete_file(&self, id: &str) -> std::io::Result<bool> {
        if self.file(id).is_none() {
            return Ok(false);
        }
        // The record first: a file without one is not listed, whatever else is left.
        std::fs::remove_file(self.files.join(format!("{id}.json")))?;
        std::fs::remove_file(self.content_path(id)).or_else(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(e)
            }
        })?;
        Ok(true)
    }

    /// The requests of input file `id`, checked as at upload.
    pub fn read_input(
        &self,
        id: &str,
        max_requests: usize,
    ) -> Result<Vec<BatchInputLine>, ApiError> {
        let text = std::fs::read_to_string(self.content_path(id)).map_err(|e| {
            ApiError::bad_request(
                format!("the input file {id} cannot be read: {e}"),
                Some("input_file_id"),
            )
        })?;
        parse_input(&text, max_requests)
    }

    /// Records a new batch over `total` requests, waiting to run.
    pub fn create_batch(&self, mut batch: Batch) -> std::io::Result<Batch> {
        batch.id = new_id("batch_");
        self.persist(&mut self.lock(), batch.clone())?;
        self.changed.notify_one();
        Ok(batch)
    }

    pub fn batch(&self, id: &str) -> Option<Batch> {
        self.lock().get(id).cloned()
    }

    /// Every batch, newest first.
    pub fn batches(&self) -> Vec<Batch> {
        self.lock().values().rev().cloned().collect()
    }

    /// The oldest batch with work left (or finalizing left).
    pub fn next_unfinished(&self) -> Option<String> {
        self.lock().values().find(|b| !b.status.is_final()).map(|b| b.id.clone())
    }

    /// Changes batch `id` with `change` and writes it; `None` when there is no such batch.
    pub fn update(
        &self,
        id: &str,
        change: impl FnOnce(&mut Batch),
    ) -> std::io::Result<Option<Batch>> {
        let mut batches = self.lock();
        let Some(mut batch) = batches.get(id).cloned() else { return Ok(None) };
        change(&mut batch);
        self.persist(&mut batches, batch.clone())?;
        Ok(Some(batch))
    }

    /// Appends a result of batch `id` to `log` and counts it.
    pub fn append_result(
        &self,
        id: &str,
        log: ResultLog,
        line: &BatchOutputLine,
    ) -> std::io::Result<()> {
        let mut text = serde_json::to_vec(line)?;
        text.push(b'\n');
        let mut file =
            std::fs::OpenOptions::new().create(true).append(true).open(self.log_path(id, log))?;
        file.write_all(&text)?;
        self.update(id, |batch| match log {
            ResultLog::Output => batch.request_counts.completed += 1,
            ResultLog::Errors => batch.request_counts.failed += 1,
        })?;
        Ok(())
    }

    /// The custom ids batch `id` has results for, with the counts they make; a torn last line
    /// (the server stopped while writing it) is dropped.
    pub fn answered(&self, id: &str) -> std::io::Result<(HashSet<String>, RequestCounts)> {
        let mut answered = HashSet::new();
        let mut counts = RequestCounts::default();
        for log in [ResultLog::Output, ResultLog::Errors] {
            let path = self.log_path(id, log);
            let Ok(file) = std::fs::File::open(&path) else { continue };
            let mut lines = Vec::new();
            let mut torn = false;
            for line in std::io::BufReader::new(file).lines() {
                let line = line?;
                match serde_json::from_str::<BatchOutputLine>(&line) {
                    Ok(result) if answered.insert(result.custom_id.clone()) => lines.push(line),
                    _ => torn = true,
                }
            }
            if torn {
                let kept: String = lines.iter().map(|l| format!("{l}\n")).collect();
                write_atomic(&path, kept.as_bytes())?;
            }
            *match log {
                ResultLog::Output => &mut counts.completed,
                ResultLog::Errors => &mut counts.failed,
            } = lines.len();
        }
        Ok((answered, counts))
    }

    /// Turns batch `id`'s result log into its file (`None` when the log is empty); the id is
    /// the batch's own, so doing it twice (after a crash) gives the same file.
    pub fn publish_log(&self, id: &str, log: ResultLog) -> std::io::Result<Option<String>> {
        let file_id = format!("file-{}-{}", id.trim_start_matches("batch_"), log.extension());
        let path = self.log_path(id, log);
        if path.exists() {
            std::fs::create_dir_all(&self.files)?;
            std::fs::rename(&path, self.content_path(&file_id))?;
        }
        let Ok(meta) = std::fs::metadata(self.content_path(&file_id)) else { return Ok(None) };
        if meta.len() == 0 {
            std::fs::remove_file(self.content_path(&file_id))?;
            return Ok(None);
        }
        let file = FileObject {
            id: file_id.clone(),
            bytes: meta.len(),
            created_at: unix_now(),
            filename: format!("{id}_{}.jsonl", log.extension()),
            purpose: "batch_output".into(),
            status: "processed".into(),
        };
        write_json(&self.files.join(format!("{file_id}.json")), &file)?;
        Ok(Some(file_id))
    }

    fn log_path(&self, id: &str, log: ResultLog) -> PathBuf {
        self.batches_dir.join(format!("{id}.{}", log.extension()))
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Batch>> {
        self.batches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `batch` to disk, then to the map (so the map never shows an unsaved state).
    fn persist(&self, batches: &mut BTreeMap<String, Batch>, batch: Batch) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.batches_dir)?;
        write_json(&self.batches_dir.join(format!("{}.json", batch.id)), &batch)?;
        batches.insert(batch.id.clone(), batch);
        Ok(())
    }
}

/// Reads an input file: one request per non-empty line, unique custom ids, at most
/// `max_requests`; the 400 names the line at fault.
pub fn parse_input(text: &str, max_requests: usize) -> Result<Vec<BatchInputLine>, ApiError> {
    let mut lines = Vec::new();
    let mut ids = HashSet::new();
    for (index, text) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        if lines.len() == max_requests {
            return Err(ApiError::bad_request(
                format!("the file has more than {max_requests} requests, the most one batch takes"),
                Some("file"),
            ));
        }
        let line = BatchInputLine::parse(text, index + 1)?;
        if !ids.insert(line.custom_id.clone()) {
            let message = format!(
                "line {} of the file: custom_id `{}` is used twice; each must be unique",
                index + 1,
                line.custom_id
            );
            return Err(ApiError::bad_request(message, Some("file")));
        }
        lines.push(line);
    }
    if lines.is_empty() {
        return Err(ApiError::bad_request("the file holds no requests", Some("file")));
    }
    Ok(lines)
}

/// An upload being written; removed when dropped before it is kept.
pub struct StagedFile {
    path: PathBuf,
}

impl StagedFile {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        // After a successful `add_file` it has been renamed away and this finds nothing.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `prefix` and 16 hex digits of the time (so ids sort by creation) and 8 random ones.
fn new_id(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{prefix}{nanos:016x}{:08x}", rand::random::<u32>())
}

/// Ids name files, so only ids this store could have made are looked up.
fn is_safe_id(id: &str) -> bool {
    !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The `*.json` records in `dir` (none when it does not exist yet).
fn json_records(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect()
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> std::io::Result<()> {
    write_atomic(path, &serde_json::to_vec_pretty(value)?)
}

/// Writes `bytes` beside `path` and renames them over it: readers see the old or the new file.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temporary = path.with_extension(format!("tmp-{:08x}", rand::random::<u32>()));
    std::fs::write(&temporary, bytes)?;
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str) -> String {
        format!(
            r#"{{"custom_id": "{id}", "method": "POST", "url": "/v1/chat/completions", "body": {{}}}}"#
        )
    }

    #[test]
    fn inputs_are_limited_and_ids_unique() {
        let two = format!("{}\n\n{}\n", line("a"), line("b"));
        assert_eq!(parse_input(&two, 2).unwrap().len(), 2);
        assert!(parse_input(&two, 1).unwrap_err().message.contains("more than 1 requests"));
        let twice = format!("{}\n{}\n", line("a"), line("a"));
        assert!(parse_input(&twice, 9)
            .unwrap_err()
            .message
            .starts_with("line 2 of the file: custom_id `a` is used twice"));
        assert!(parse_input("\n", 9).unwrap_err().message.contains("no requests"));
    }

    #[test]
    fn ids_sort_by_creation_and_cannot_leave_the_folder() {
        let (a, b) = (new_id("batch_"), new_id("batch_"));
        // The time comes first (the random part only breaks ties within a nanosecond).
        assert!(a[..22] <= b[..22], "{a} {b}");
        assert!(is_safe_id(&a) && !is_safe_id("../x") && !is_safe_id(""));
    }
}
