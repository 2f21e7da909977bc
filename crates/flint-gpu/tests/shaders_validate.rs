//! Preprocesses every shader variant the engine can request, validates it with naga and
//! translates it to MSL (Metal) and HLSL (DX12) as wgpu's backends would, without a GPU: a
//! broken variant, or one only Vulkan can take, fails on any machine.

use flint_gpu::ops::all_variants;
use flint_gpu::shader::preprocess;
use flint_gpu::Caps;

fn validate(label: &str, source: &str, caps: &Caps) {
    let module = naga::front::wgsl::parse_str(source).unwrap_or_else(|e| panic!("{label}: {}", e.emit_to_string(source)));
    // pack2x16float / unpack2x16float (f16 KV caches) are core WGSL; wgpu grants naga this
    // capability on every backend but GLES without the half-float packing extension.
    let mut flags = naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
    if caps.shader_f16 {
        flags |= naga::valid::Capabilities::SHADER_FLOAT16;
    }
    if caps.subgroups {
        flags |= naga::valid::Capabilities::SUBGROUP;
    }
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), flags)
        .validate(&module)
        .unwrap_or_else(|e| panic!("{label}: {}", e.emit_to_string(source)));
    translate(label, &module, &info);
}

/// Writes `module` as Metal Shading Language 2.4 and as HLSL for shader model 6.2 (the
/// versions that have subgroup operations and 16-bit floats), with wgpu's loop counters where
/// the default tuning has them on a GPU (`loop_bounding`), failing on what either refuses.
fn translate(label: &str, module: &naga::Module, info: &naga::valid::ModuleInfo) {
    let force_loop_bounding = flint_gpu::tune::Tuning::default().runtime_checks(false).force_loop_bounding;
    let msl = naga::back::msl::Options { lang_version: (2, 4), force_loop_bounding, ..Default::default() };
    let (text, _) = naga::back::msl::write_string(module, info, &msl, &Default::default()).unwrap_or_else(|e| panic!("{label}: to MSL: {e}"));
    assert!(text.contains("kernel void"), "{label}: MSL without a compute entry point");
    let hlsl = naga::back::hlsl::Options { shader_model: naga::back::hlsl::ShaderModel::V6_2, force_loop_bounding, ..Default::default() };
    let mut text = String::new();
    naga::back::hlsl::Writer::new(&mut text, &hlsl, &Default::default()).write(module, info, None).unwrap_or_else(|e| panic!("{label}: to HLSL: {e}"));
    assert!(text.contains("[numthreads("), "{label}: HLSL without a compute entry point");
}

#[test]
fn every_variant_preprocesses_and_validates() {
    let cap_sets = [
        Caps::default(),
        Caps { shader_f16: true, ..Default::default() },
        Caps { subgroups: true, subgroup_min_size: 32, ..Default::default() },
        Caps { shader_f16: true, subgroups: true, subgroup_min_size: 8, timestamps: true, cpu_like: true, ..Default::default() },
    ];
    let mut n = 0;
    let mut seen = std::collections::HashSet::new();
    for caps in &cap_sets {
        for key in all_variants(caps) {
            if !seen.insert(key.clone()) {
                continue;
            }
            let src = preprocess(key.shader, &key.defs).unwrap_or_else(|e| panic!("{}: {e}", key.label()));
            validate(&key.label(), &src, caps);
            n += 1;
        }
    }
    eprintln!("validated {n} shader variants and translated each to MSL and HLSL");
}

#[test]
fn preprocessor_reports_bad_directives() {
    // Unknown files are typed errors, not panics.
    assert!(preprocess("no_such.wgsl", &Default::default()).is_err());
}
