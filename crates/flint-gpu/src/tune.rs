//! The GPU kernels' shape choices as knobs, so that one run on a lent GPU can time several
//! settings without a rebuild: `FLINT_TUNE=key=value,...` (native only; read when a device is
//! opened). Every knob defaults to the constant its op documents. A setting changes which
//! variants run; under any setting a token's result is the same whatever shares its step: a
//! matrix's lanes per row are the same at every step size, and the attention split policy stays
//! a function of a token's own length (another setting may sum in another order, so its last
//! bits may differ from the defaults'). `bench/device/tune.sh` sweeps them.

use std::fmt;

use crate::ops::{attention, matmul};

/// What the tiled GEMM (`shaders/matmul_tiled.wgsl`) stages and multiplies: f32, f16 (F16),
/// or 8-bit integers, the activations quantized per 32-element chunk (Q8_CHUNKS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmIn {
    F32,
    F16,
    Q8,
}

impl fmt::Display for GemmIn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GemmIn::F32 => "f32",
            GemmIn::F16 => "f16",
            GemmIn::Q8 => "q8",
        })
    }
}

/// Shape knobs of the GPU (lane-team) kernels, which CPU-type adapters ignore, and the checks
/// wgpu compiles into every kernel, on any adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// `min_groups`: the fewest workgroups a matmul's grid aims for: its workgroup shrinks
    /// (256 → 128 → 64 lanes) until the grid has them, and a step past the largest token
    /// block takes the largest GEMM tile whose grid has them.
    pub min_groups: u64,
    /// `max_wg`: the largest lane-team workgroup (64, 128 or 256).
    pub max_wg: u32,
    /// `lanes`: lanes per weight row (8, 16 or 32); None (`auto`): from the row's length
    /// ([`matmul::lanes_per_row`]).
    pub lanes: Option<u32>,
    /// `max_block`: the largest mat-vec token block built (1, 4, 8 or 16); larger steps up to
    /// 16 tokens take its tiles, each reading the weights again (from L2 where they fit).
    pub max_block: u32,
    /// `gemm_min_groups`: a step past the largest token block takes the smallest GEMM tile
    /// while its grid has this many workgroups; None (`off`): never the GEMM.
    pub gemm_min_groups: Option<u64>,
    /// `gemm_side`: the largest GEMM tile side in lanes (16: 64 × 64 tiles, 8: 32 × 32).
    pub gemm_side: u32,
    /// `gemm_rows`: weight rows a lane of the largest GEMM tile (4: 64 × 64; 8: also the tall
    /// 128 × 64 tile, taken first where its grid spreads; see [`matmul::GEMM_ROWS`]).
    pub gemm_rows: u32,
    /// `gemm_in`: what the GEMM stages its tiles in and multiplies (`f32`, `f16` where the
    /// adapter has shader-f16, or `q8`: 8-bit integers for the formats of
    /// [`matmul::Q8_FORMATS`]); f32 until a GPU's figures say another pays.
    pub gemm_in: GemmIn,
    /// `q8_act`: the mat-vec kernels (steps of up to 16 tokens) quantize the activations to 8
    /// bits per 32-element chunk in workgroup memory, a slice at a time, and multiply integer
    /// weight chunks with them (`dot4I8Packed`), for the formats of [`matmul::Q8_FORMATS`]
    /// (`on`/`off`; off until a GPU's figures say it pays; see [`matmul::q8_slice`]).
    pub q8_act: bool,
    /// `split_groups`: split-attention workgroups a decode token aims for.
    pub split_groups: u32,
    /// `split_min`: the fewest positions of one attention split.
    pub split_min: u32,
    /// `tiles_from`: steps of more than this many tokens take the query-tiled attention; None
    /// (`off`): never.
    pub tiles_from: Option<u32>,
    /// `loop_bounding`: wgpu's guard against endless loops, a 64-bit counter and an exit
    /// test compiled into every loop (`on`/`off`; None, `auto`: on for CPU-type adapters, off
    /// on GPUs). Every loop of Flint's kernels ends by construction, and on a GPU the guard
    /// costs each iteration and can keep the driver from unrolling a register tile's loops. On
    /// a CPU-type adapter the guard is what keeps LLVM from unrolling the CPU kernels' loops
    /// fully, which makes their compiles several times longer for no speed (see
    /// [`Tuning::runtime_checks`]).
    pub loop_bounding: Option<bool>,
    /// `bounds_checks`: wgpu's clamp of every array and buffer index the driver does not
    /// bound itself (`on`/`off`; on until a GPU's figures say dropping it pays; on Vulkan
    /// with robust buffer access it is only the workgroup and register arrays' clamps).
    pub bounds_checks: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            min_groups: matmul::GPU_MIN_GROUPS,
            max_wg: matmul::GPU_WGS[0],
            lanes: None,
            max_block: matmul::TOKEN_BLOCKS[matmul::TOKEN_BLOCKS.len() - 1],
            gemm_min_groups: Some(matmul::GEMM_MIN_GROUPS),
            gemm_side: matmul::GEMM_SIDES[0],
            gemm_rows: matmul::GEMM_ROWS[0],
            gemm_in: GemmIn::F32,
            q8_act: false,
            split_groups: attention::SPLIT_TARGET_GROUPS,
            split_min: attention::GPU_SPLIT_MIN_POSITIONS,
            tiles_from: Some(attention::TILES_MIN_TOKENS),
            loop_bounding: None,
            bounds_checks: true,
        }
    }
}

const KEYS: &str = "min_groups, max_wg, lanes, max_block, gemm_min_groups, gemm_side, gemm_rows, gemm_in, q8_act, split_groups, split_min, tiles_from, loop_bounding, bounds_checks";

/// Largest value a count knob takes: far past any grid or context that makes sense, and
/// small enough that no product of it overflows.
const MOST: u64 = 1 << 20;

impl Tuning {
    /// Parses `key=value` pairs separated by commas over the defaults; an unknown key, a
    /// malformed value or one out of range is an error naming it.
    pub fn parse(s: &str) -> Result<Tuning, String> {
        let mut t = Tuning::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item.split_once('=').ok_or_else(|| format!("{item:?}: expected key=value"))?;
            let (key, value) = (key.trim(), value.trim());
            let count = || match value.parse::<u64>() {
                Ok(n) if (1..=MOST).contains(&n) => Ok(n),
                _ => Err(format!("{key}={value:?}: expected a count from 1 to {MOST}")),
            };
            let one_of = |allowed: &[u32]| match value.parse::<u32>() {
                Ok(n) if allowed.contains(&n) => Ok(n),
                _ => Err(format!("{key}={value:?}: expected one of {allowed:?}")),
            };
            let off = value == "off";
            let switch = || match value {
                "on" => Ok(true),
                "off" => Ok(false),
                _ => Err(format!("{key}={value:?}: expected on or off")),
            };
            match key {
                "min_groups" => t.min_groups = count()?,
                "max_wg" => t.max_wg = one_of(&matmul::GPU_WGS)?,
                "lanes" if value == "auto" => t.lanes = None,
                "lanes" => t.lanes = Some(one_of(&matmul::LANES_PER_ROW)?),
                "max_block" => t.max_block = one_of(&matmul::TOKEN_BLOCKS)?,
                "gemm_min_groups" if off => t.gemm_min_groups = None,
                "gemm_min_groups" => t.gemm_min_groups = Some(count()?),
                "gemm_side" => t.gemm_side = one_of(&matmul::GEMM_SIDES)?,
                "gemm_rows" => t.gemm_rows = one_of(&matmul::GEMM_ROWS)?,
                "gemm_in" => {
                    t.gemm_in = match value {
                        "f32" => GemmIn::F32,
                        "f16" => GemmIn::F16,
                        "q8" => GemmIn::Q8,
                        _ => return Err(format!("{key}={value:?}: expected f32, f16 or q8")),
                    }
                }
                "q8_act" => t.q8_act = switch()?,
                "split_groups" => t.split_groups = count()? as u32,
                "split_min" => t.split_min = count()? as u32,
                "tiles_from" if off => t.tiles_from = None,
                "tiles_from" => t.tiles_from = Some(count()? as u32),
                "loop_bounding" if value == "auto" => t.loop_bounding = None,
                "loop_bounding" => t.loop_bounding = Some(switch()?),
                "bounds_checks" => t.bounds_checks = switch()?,
                _ => return Err(format!("unknown key {key:?} (known: {KEYS})")),
            }
        }
        Ok(t)
    }

    /// What wgpu compiles into the kernels to guard them at run time on an adapter that is a
    /// CPU (`cpu_adapter`: lavapipe, SwiftShader) or not: its checks but those `loop_bounding`
    /// and `bounds_checks` turn off (natively: in a browser its WebGPU decides). Integer division stays guarded (a zero divisor gives a
    /// defined result), as do the checks for features Flint does not use. On lavapipe the
    /// loop guard costs the kernels nothing measurable (`flint bench -p 128 -n 32`, both test
    /// models, within the runs' 8% noise), and without it the matmul tests' compiles take
    /// 2.7 times as long (363 s against 134), so `auto` keeps it there.
    pub fn runtime_checks(&self, cpu_adapter: bool) -> wgpu::ShaderRuntimeChecks {
        wgpu::ShaderRuntimeChecks {
            force_loop_bounding: self.loop_bounding.unwrap_or(cpu_adapter),
            bounds_checks: self.bounds_checks,
            ..wgpu::ShaderRuntimeChecks::checked()
        }
    }

    /// `FLINT_TUNE` (native), or the defaults.
    pub fn from_env() -> Result<Tuning, String> {
        #[cfg(not(target_arch = "wasm32"))]
        if let Ok(s) = std::env::var("FLINT_TUNE") {
            return Tuning::parse(&s).map_err(|e| format!("FLINT_TUNE: {e}"));
        }
        Ok(Tuning::default())
    }
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// The settings as `FLINT_TUNE` takes them, every knob named.
impl fmt::Display for Tuning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: Option<u64>, none: &str| v.map_or(none.to_string(), |n| n.to_string());
        write!(
            f,
            "min_groups={},max_wg={},lanes={},max_block={},gemm_min_groups={},gemm_side={},gemm_rows={},gemm_in={},q8_act={},split_groups={},split_min={},tiles_from={},loop_bounding={},bounds_checks={}",
            self.min_groups,
            self.max_wg,
            opt(self.lanes.map(u64::from), "auto"),
            self.max_block,
            opt(self.gemm_min_groups, "off"),
            self.gemm_side,
            self.gemm_rows,
            self.gemm_in,
            on_off(self.q8_act),
            self.split_groups,
            self.split_min,
            opt(self.tiles_from.map(u64::from), "off"),
            self.loop_bounding.map_or("auto", on_off),
            on_off(self.bounds_checks),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_over_the_defaults_and_prints_what_it_parses() {
        assert_eq!(Tuning::parse("").unwrap(), Tuning::default());
        let t = Tuning::parse(
            " lanes=16, gemm_min_groups=off,max_wg=64,split_min=128 ,max_block=8,gemm_in=q8,q8_act=on,gemm_rows=8,loop_bounding=on,bounds_checks=off",
        )
        .unwrap();
        assert_eq!((t.lanes, t.max_block, t.gemm_in, t.q8_act, t.gemm_rows), (Some(16), 8, GemmIn::Q8, true, 8));
        assert_eq!(Tuning::parse("gemm_in=f16").unwrap().gemm_in, GemmIn::F16);
        assert_eq!(t.gemm_min_groups, None);
        assert_eq!((t.loop_bounding, t.bounds_checks), (Some(true), false));
        let checks = t.runtime_checks(false);
        assert!(checks.force_loop_bounding && !checks.bounds_checks && checks.int_div_checks);
        let (gpu, cpu) = (Tuning::default().runtime_checks(false), Tuning::default().runtime_checks(true));
        assert!(!gpu.force_loop_bounding && gpu.bounds_checks && gpu.int_div_checks);
        assert!(cpu.force_loop_bounding && cpu.bounds_checks && cpu.int_div_checks);
        assert!(!Tuning::parse("loop_bounding=off").unwrap().runtime_checks(true).force_loop_bounding);
        assert_eq!(Tuning::parse("loop_bounding=on,loop_bounding=auto").unwrap(), Tuning::default());
        assert_eq!((t.max_wg, t.split_min), (64, 128));
        assert_eq!(t.min_groups, Tuning::default().min_groups);
        assert_eq!(Tuning::parse(&t.to_string()).unwrap(), t);
        assert_eq!(Tuning::parse(&Tuning::default().to_string()).unwrap(), Tuning::default());
    }

    #[test]
    fn refuses_what_it_does_not_know_naming_it() {
        for (bad, says) in [
            ("lanes=12", "lanes=\"12\""),
            ("max_wg=1024", "max_wg"),
            ("max_block=32", "max_block"),
            ("min_groups=0", "min_groups"),
            ("min_groups=99999999999999999999", "min_groups"),
            ("split_groups=-1", "split_groups"),
            ("gemm_side=off", "gemm_side"),
            ("gemm_rows=16", "gemm_rows=\"16\": expected one of [4, 8]"),
            ("gemm_in=1", "gemm_in=\"1\": expected f32, f16 or q8"),
            ("gemm_f16=on", "unknown key \"gemm_f16\""),
            ("q8_act=yes", "q8_act=\"yes\": expected on or off"),
            ("loop_bounding=1", "loop_bounding=\"1\": expected on or off"),
            ("tiles=3", "unknown key \"tiles\""),
            ("lanes", "expected key=value"),
        ] {
            let e = Tuning::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
