//! The driver's pipeline cache kept on disk (native, Vulkan with wgpu's `PIPELINE_CACHE`):
//! a later process hands the driver the machine code it built before instead of compiling
//! every kernel again. Drivers with their own disk cache gain little (NVIDIA's keeps one, and
//! Mesa's lavapipe returns a bare header); drivers that leave caching to the application gain
//! the whole compile.
//!
//! The file is named by `wgpu::util::pipeline_cache_key` (backend, vendor and device), lives
//! in `$FLINT_PIPELINE_CACHE` (a directory; `off` disables it) or else
//! `$XDG_CACHE_HOME/flint/pipelines` or `~/.cache/flint/pipelines`, and is replaced
//! atomically (written beside, then renamed). wgpu checks the header (its version, the
//! adapter, the driver's validation key) and the driver checks its own, so a stale or foreign
//! file is ignored, not trusted.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Files larger than this are not read: a pipeline cache for Flint's kernels is a few MiB.
const MAX_BYTES: u64 = 256 << 20;

/// The environment variable naming the cache directory, or `off`.
pub const ENV: &str = "FLINT_PIPELINE_CACHE";

/// A driver pipeline cache and the file it is saved to.
pub struct DiskCache {
    pub cache: wgpu::PipelineCache,
    path: PathBuf,
    /// Pipelines were built with the cache since it was last saved.
    dirty: AtomicBool,
}

impl std::fmt::Debug for DiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache").field("path", &self.path).finish_non_exhaustive()
    }
}

/// Where the cache for `info` lives: None when disabled, on a backend without pipeline
/// caches, or with no home directory.
pub fn path_for(info: &wgpu::AdapterInfo) -> Option<PathBuf> {
    path_with(info, |name| std::env::var_os(name))
}

/// [`path_for`] with the environment read through `var`.
fn path_with(info: &wgpu::AdapterInfo, var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let key = wgpu::util::pipeline_cache_key(info)?;
    let dir = match var(ENV) {
        Some(v) if v == "off" => return None,
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => var("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")))?
            .join("flint")
            .join("pipelines"),
    };
    Some(dir.join(key))
}

impl DiskCache {
    /// Opens the cache for `device`, seeded with the file at `path` when it holds one. The
    /// device must have been created with `Features::PIPELINE_CACHE`.
    pub fn open(device: &wgpu::Device, path: PathBuf) -> DiskCache {
        let data = std::fs::metadata(&path).ok().filter(|m| m.is_file() && m.len() <= MAX_BYTES).and_then(|_| std::fs::read(&path).ok());
        // SAFETY: the data was written by `save` from `PipelineCache::get_data` of an adapter
        // with the same `pipeline_cache_key` (the file's name), and `fallback: true` makes wgpu
        // start empty when its header (wgpu's version, adapter key, driver validation key) does
        // not match.
        let cache =
            unsafe { device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor { label: Some("flint pipelines"), data: data.as_deref(), fallback: true }) };
        DiskCache { cache, path, dirty: AtomicBool::new(false) }
    }

    /// Notes that a pipeline was built with the cache.
    pub fn touch(&self) {
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// Writes the cache to its file if pipelines were built since the last save; errors
    /// (a read-only home, a full disk) only cost the next process its compile, so they are
    /// reported and otherwise ignored.
    pub fn save(&self) {
        if !self.dirty.swap(false, Ordering::Relaxed) {
            return;
        }
        let Some(data) = self.cache.get_data() else { return };
        if let Err(e) = write_atomically(&self.path, &data) {
            tracing::warn!("pipeline cache not saved to {}: {e}", self.path.display());
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DiskCache {
    fn drop(&mut self) {
        self.save();
    }
}

fn write_atomically(path: &Path, data: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vulkan_adapters_get_a_file_other_backends_none() {
        let mut info = wgpu::AdapterInfo {
            name: "x".into(),
            vendor: 0x10de,
            device: 0x2335,
            device_type: wgpu::DeviceType::DiscreteGpu,
            device_pci_bus_id: String::new(),
            driver: String::new(),
            driver_info: String::new(),
            backend: wgpu::Backend::Vulkan,
            subgroup_min_size: 32,
            subgroup_max_size: 32,
            transient_saves_memory: None,
            limit_bucket: None,
        };
        let env = |pairs: &'static [(&'static str, &'static str)]| move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.into());
        let named = env(&[(ENV, "/tmp/pc"), ("HOME", "/home/u")]);
        assert_eq!(path_with(&info, named), Some(PathBuf::from("/tmp/pc/wgpu_pipeline_cache_vulkan_4318_9013")));
        assert_eq!(path_with(&info, env(&[(ENV, "off"), ("HOME", "/home/u")])), None);
        let xdg = env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/home/u")]);
        assert_eq!(path_with(&info, xdg), Some(PathBuf::from("/x/flint/pipelines/wgpu_pipeline_cache_vulkan_4318_9013")));
        let home = env(&[("HOME", "/home/u")]);
        assert_eq!(path_with(&info, home), Some(PathBuf::from("/home/u/.cache/flint/pipelines/wgpu_pipeline_cache_vulkan_4318_9013")));
        assert_eq!(path_with(&info, env(&[])), None, "no home, no cache");
        info.backend = wgpu::Backend::Metal;
        assert_eq!(path_with(&info, home), None);
    }

    #[test]
    fn a_save_replaces_the_file_whole() {
        let dir = std::env::temp_dir().join(format!("flint-pc-save-{}", std::process::id()));
        let path = dir.join("cache");
        write_atomically(&path, b"first").unwrap();
        write_atomically(&path, b"second, longer").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second, longer");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left.len(), 1, "no temporary file left: {left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
