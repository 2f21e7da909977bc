//! The shader registry (every `shaders/*.wgsl`, embedded) and a tiny preprocessor for
//! variants: `#include "x.wgsl"`, `#define`, `#ifdef`/`#ifndef`/`#else`/`#endif`, and
//! substitution of defined names. One shader tree; variants come from [`ShaderDefs`].

use std::collections::BTreeMap;

use flint_core::quant::QuantType;

use crate::error::{GpuError, Result};

/// Every shader file, by name. Kernels refer to shaders only through this table.
pub const SHADERS: &[(&str, &str)] = &[
    ("common.wgsl", include_str!("../../../shaders/common.wgsl")),
    ("dequant.wgsl", include_str!("../../../shaders/dequant.wgsl")),
    ("dequant_q8.wgsl", include_str!("../../../shaders/dequant_q8.wgsl")),
    ("add.wgsl", include_str!("../../../shaders/add.wgsl")),
    ("attention.wgsl", include_str!("../../../shaders/attention.wgsl")),
    ("embed.wgsl", include_str!("../../../shaders/embed.wgsl")),
    ("glu.wgsl", include_str!("../../../shaders/glu.wgsl")),
    ("kv_write.wgsl", include_str!("../../../shaders/kv_write.wgsl")),
    ("matmul.wgsl", include_str!("../../../shaders/matmul.wgsl")),
    ("matmul_blocked.wgsl", include_str!("../../../shaders/matmul_blocked.wgsl")),
    ("matmul_tiled.wgsl", include_str!("../../../shaders/matmul_tiled.wgsl")),
    ("matmul_io.wgsl", include_str!("../../../shaders/matmul_io.wgsl")),
    ("moe.wgsl", include_str!("../../../shaders/moe.wgsl")),
    ("paged.wgsl", include_str!("../../../shaders/paged.wgsl")),
    ("penalize.wgsl", include_str!("../../../shaders/penalize.wgsl")),
    ("rms_norm.wgsl", include_str!("../../../shaders/rms_norm.wgsl")),
    ("rope.wgsl", include_str!("../../../shaders/rope.wgsl")),
    ("rope_common.wgsl", include_str!("../../../shaders/rope_common.wgsl")),
    ("sample_argmax.wgsl", include_str!("../../../shaders/sample_argmax.wgsl")),
    ("sample_common.wgsl", include_str!("../../../shaders/sample_common.wgsl")),
    ("sample_logprobs.wgsl", include_str!("../../../shaders/sample_logprobs.wgsl")),
    ("sample_spec.wgsl", include_str!("../../../shaders/sample_spec.wgsl")),
    ("sample_threshold.wgsl", include_str!("../../../shaders/sample_threshold.wgsl")),
    ("softcap.wgsl", include_str!("../../../shaders/softcap.wgsl")),
];

const MAX_INCLUDE_DEPTH: usize = 8;

pub fn source(name: &str) -> Result<&'static str> {
    SHADERS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s).ok_or_else(|| GpuError::Shader { shader: name.into(), message: "no such shader file".into() })
}

/// Compile-time parameters of one shader variant; ordered so equal sets compare equal.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShaderDefs {
    defs: BTreeMap<String, String>,
}

impl ShaderDefs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Defines `name` (as `true`) when `on`; `#ifdef name` tests it.
    pub fn flag(mut self, name: &str, on: bool) -> Self {
        if on {
            self.defs.insert(name.into(), "true".into());
        }
        self
    }

    pub fn u32(mut self, name: &str, v: u32) -> Self {
        self.defs.insert(name.into(), format!("{v}u"));
        self
    }

    pub fn f32(mut self, name: &str, v: f32) -> Self {
        self.defs.insert(name.into(), format!("{v:?}f"));
        self
    }

    /// The weight format: `Q_<NAME>` for `#ifdef`, plus `BLOCK_ELEMS` and `BLOCK_BYTES`; `W_VEC4`
    /// where it is read as vectors, and `GROUP_VEC4S` where it is regrouped (weights::layout).
    pub fn quant(mut self, ty: QuantType) -> Self {
        self.defs.insert(format!("Q_{}", ty.name()), "true".into());
        self.defs.insert("BLOCK_ELEMS".into(), format!("{}u", ty.block_elems()));
        self.defs.insert("BLOCK_BYTES".into(), format!("{}u", ty.block_bytes()));
        // Read as 16-byte vectors where the GPU layout aligns them.
        if crate::weights::layout::vectors(ty) {
            self.defs.insert("W_VEC4".into(), "true".into());
        }
        // A regrouped format's group stride, from the layout that wrote it.
        if let Some(n) = crate::weights::layout::group_vectors(ty) {
            self.defs.insert("GROUP_VEC4S".into(), format!("{n}u"));
        }
        self
    }

    /// Defines `name` as generated WGSL (several lines); labels show only the name.
    pub fn code(mut self, name: &str, wgsl: String) -> Self {
        self.defs.insert(name.into(), wgsl);
        self
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.defs.get(name).map(|s| s.as_str())
    }

    /// A compact label suffix: `Q_Q4_K.BLOCK_BYTES=144u...`.
    pub fn label(&self) -> String {
        self.defs.iter().map(|(k, v)| if v == "true" || v.contains('\n') { k.clone() } else { format!("{k}={v}") }).collect::<Vec<_>>().join(",")
    }
}

/// Expands includes and conditionals of `name` and substitutes defined names.
pub fn preprocess(name: &str, defs: &ShaderDefs) -> Result<String> {
    let mut defs = defs.defs.clone();
    let mut out = String::new();
    expand(name, &mut defs, &mut out, 0)?;
    Ok(out)
}

fn err(shader: &str, line: usize, message: impl Into<String>) -> GpuError {
    GpuError::Shader { shader: format!("{shader}:{line}"), message: message.into() }
}

fn expand(name: &str, defs: &mut BTreeMap<String, String>, out: &mut String, depth: usize) -> Result<()> {
    if depth > MAX_INCLUDE_DEPTH {
        return Err(err(name, 0, "includes nested too deeply"));
    }
    let src = source(name)?;
    // Each entry: (this branch is active, some branch of this #if was taken).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    for (i, line) in src.lines().enumerate() {
        let n = i + 1;
        let t = line.trim_start();
        let active = stack.iter().all(|s| s.0);
        if let Some(rest) = t.strip_prefix('#') {
            let mut parts = rest.split_whitespace();
            let word = parts.next().unwrap_or("");
            let arg = parts.next();
            match word {
                "ifdef" | "ifndef" => {
                    let a = arg.ok_or_else(|| err(name, n, "#ifdef needs a name"))?;
                    let cond = defs.contains_key(a) == (word == "ifdef");
                    stack.push((cond, cond));
                }
                "else" => {
                    let top = stack.last_mut().ok_or_else(|| err(name, n, "#else without #ifdef"))?;
                    top.0 = !top.1;
                    top.1 = true;
                }
                "endif" => {
                    stack.pop().ok_or_else(|| err(name, n, "#endif without #ifdef"))?;
                }
                "define" if active => {
                    let a = arg.ok_or_else(|| err(name, n, "#define needs a name"))?;
                    let value = rest.trim_start()["define".len()..].trim_start()[a.len()..].trim().to_string();
                    defs.entry(a.to_string()).or_insert(if value.is_empty() { "true".into() } else { value });
                }
                "include" if active => {
                    let a = arg.ok_or_else(|| err(name, n, "#include needs a file"))?.trim_matches('"');
                    expand(a, defs, out, depth + 1)?;
                }
                "define" | "include" => {}
                other => return Err(err(name, n, format!("unknown directive #{other}"))),
            }
            continue;
        }
        if active {
            substitute(line, defs, out);
            out.push('\n');
        }
    }
    if !stack.is_empty() {
        return Err(err(name, src.lines().count(), "unterminated #ifdef"));
    }
    Ok(())
}

/// Replaces whole identifiers that are defined names with their values.
fn substitute(line: &str, defs: &BTreeMap<String, String>, out: &mut String) {
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let word = &line[start..i];
            match defs.get(word) {
                Some(v) => out.push_str(v),
                None => out.push_str(word),
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            out.push_str(&line[i..]);
            return;
        } else {
            let ch = line[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitution_is_whole_word() {
        let mut defs = BTreeMap::new();
        defs.insert("WG".to_string(), "64u".to_string());
        let mut out = String::new();
        substitute("@workgroup_size(WG) var WGX = WG; // WG stays", &defs, &mut out);
        assert_eq!(out, "@workgroup_size(64u) var WGX = 64u; // WG stays");
    }
}
